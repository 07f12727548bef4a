// halformer._native: the generic Python binding of the runtime (halformer/model.h).
// The pure-Python halformer/model.py wraps it; users never call this directly.
//
// Design:
//  - One Model type for every model: it dlopen()s a built model's lib<name>.so
//    (RTLD_NOW | RTLD_LOCAL, so that every model's fixed entry point
//    halformer_model_descriptor and kernel symbols stay private to it) and loads it with
//    halformer::Model::load. Its Halide calls bind to the libhalformer_rt.so this module
//    links. The library is never dlclose()d: the Halide runtime may keep pointers into
//    it (GPU module caches), and dlopen of the same path again just returns it (Python
//    loads a rebuilt file from a private copy, see halformer/library.py).
//  - Inputs arrive already checked and packed by Python (a flat int32 array of token ids
//    plus int64 row offsets, B + 1 of them): one conversion path for lists and numpy.
//  - The GIL is released around every runtime call, so Python threads run models in
//    parallel; the streaming callback re-acquires it. An exception raised by the
//    callback stops the decode and is re-raised to the caller as itself.
//  - Outputs: the runtime's std::vector<float> is moved into a capsule that owns it, and
//    the numpy array views it (no copy).
//  - halformer::Error (bad weights, ids, options) becomes ValueError, same message.
#include <dlfcn.h>

#include <exception>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "halformer/engine.h"
#include "halformer/error.h"
#include "halformer/generation.h"
#include "halformer/model.h"
#include "halformer/tokenizer.h"

namespace nb = nanobind;
using halformer::Error;
using halformer::Sequence;

namespace {

using IdArray = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using OffsetArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using FloatArray = nb::ndarray<nb::numpy, float>;

// Packed (ids, offsets) -> one Sequence per row. Python made offsets monotonic in [0, n].
std::vector<Sequence> unpack(const IdArray& ids, const OffsetArray& offsets) {
  std::vector<Sequence> out;
  const int64_t n = int64_t(ids.shape(0)), rows = int64_t(offsets.shape(0)) - 1;
  const int32_t* p = ids.data();
  const int64_t* o = offsets.data();
  for (int64_t r = 0; r < rows; ++r) {
    if (o[r] < 0 || o[r] > o[r + 1] || o[r + 1] > n) throw Error("internal: bad packed batch offsets");
    out.emplace_back(p + o[r], p + o[r + 1]);
  }
  return out;
}

FloatArray to_numpy(halformer::Tensor&& t) {
  auto* data = new std::vector<float>(std::move(t.data));
  nb::capsule owner(data, [](void* v) noexcept { delete static_cast<std::vector<float>*>(v); });
  std::vector<size_t> shape(t.shape.begin(), t.shape.end());
  return FloatArray(data->data(), shape.size(), shape.data(), owner);
}

// dlopen()s a model library (once: dlopen of a loaded path returns it) and returns its
// descriptor; Error naming the file when it is not a halformer model library.
const halformer::ModelDescriptor* open_library(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    throw Error(library + ": cannot load the model library (" + (e ? e : "unknown error") + ")");
  }
  using Entry = const halformer::ModelDescriptor* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "halformer_model_descriptor"));
  if (!entry)
    throw Error(library + ": no halformer_model_descriptor() in it: not a model library made by `halformer build`");
  const halformer::ModelDescriptor* desc = entry();
  if (!desc) throw Error(library + ": halformer_model_descriptor() returned null");
  return desc;
}

class NativeModel {
 public:
  NativeModel(const std::string& library, const std::string& weights, const std::string& device, int threads) {
    const halformer::ModelDescriptor* desc = open_library(library);
    nb::gil_scoped_release release;  // reading weights can take a while
    model_ = std::make_unique<halformer::Model>(halformer::Model::load(*desc, weights, {threads, device}));
  }

  nb::dict config() const {
    const auto& c = model_->config();
    nb::dict d;
    d["name"] = c.name;
    d["spec_file"] = c.spec_file;
    d["arch"] = halformer::enum_name(c.arch);
    d["d_model"] = c.d_model, d["heads"] = c.heads, d["d_ff"] = c.d_ff;
    d["encoder_layers"] = c.encoder_layers, d["decoder_layers"] = c.decoder_layers;
    d["src_vocab"] = c.src_vocab, d["tgt_vocab"] = c.tgt_vocab, d["max_len"] = c.max_len;
    d["type_vocab"] = c.type_vocab;
    d["pre_norm"] = c.pre_norm, d["final_norm"] = c.final_norm;
    d["positions"] = halformer::enum_name(c.positions);
    d["embedding_norm"] = c.embedding_norm;
    d["embedding_size"] = c.embedding_size, d["shared_layers"] = c.shared_layers;
    d["share_src_tgt"] = c.share_src_tgt, d["share_tgt_output"] = c.share_tgt_output;
    d["causal"] = c.causal, d["padding_mask"] = c.padding_mask;
    d["head"] = halformer::enum_name(c.head);
    d["mean_pooling"] = c.mean_pooling, d["pooler"] = c.pooler, d["num_classes"] = c.num_classes;
    d["pad_id"] = c.pad_id, d["bos_id"] = c.bos_id, d["eos_id"] = c.eos_id;
    d["max_new_tokens"] = c.max_new_tokens;
    d["beam"] = c.beam, d["beam_size"] = c.beam_size, d["length_penalty"] = c.length_penalty;
    d["preset"] = c.preset_name;
    d["position_offset"] = c.position_offset;
    if (c.weight_map) {
      nb::dict map;
      for (const char* const* kv = c.weight_map; kv[0] && kv[1]; kv += 2) map[kv[0]] = kv[1];
      d["weight_map"] = map;
    } else {
      d["weight_map"] = nb::none();
    }
    return d;
  }
  const halformer::Model& model() const { return *model_; }
  std::string devices() const { return model_->descriptor().devices; }
  std::string device() const { return model_->device(); }
  int threads() const { return model_->threads(); }

  FloatArray encode(const IdArray& ids, const OffsetArray& offsets) const {
    auto src = unpack(ids, offsets);
    halformer::Tensor t;
    {
      nb::gil_scoped_release release;
      t = model_->encode(src);
    }
    return to_numpy(std::move(t));
  }
  FloatArray pooled(const IdArray& ids, const OffsetArray& offsets) const {
    auto src = unpack(ids, offsets);
    halformer::Tensor t;
    {
      nb::gil_scoped_release release;
      t = model_->pooled(src);
    }
    return to_numpy(std::move(t));
  }
  FloatArray score(const IdArray& ids, const OffsetArray& offsets, const IdArray& tgt_ids,
                   const OffsetArray& tgt_offsets) const {
    auto src = unpack(ids, offsets), tgt = unpack(tgt_ids, tgt_offsets);
    halformer::Tensor t;
    {
      nb::gil_scoped_release release;
      t = model_->score(src, tgt);
    }
    return to_numpy(std::move(t));
  }

  // Greedy / sampling. Returns (tokens per row, log-probabilities per row or []).
  std::pair<std::vector<Sequence>, std::vector<std::vector<float>>> generate(
      const IdArray& ids, const OffsetArray& offsets, const halformer::GenerationOptions& options,
      nb::object on_token) const {
    auto src = unpack(ids, offsets);
    halformer::GenerationOptions o = options;
    std::exception_ptr callback_error;  // guarded by the GIL
    if (!on_token.is_none()) {
      o.on_token = [&](int row, int32_t token, float logprob) -> bool {
        nb::gil_scoped_acquire acquire;
        if (callback_error) return false;
        try {
          return nb::cast<bool>(o.return_scores ? on_token(row, token, logprob) : on_token(row, token));
        } catch (...) {
          callback_error = std::current_exception();
          return false;
        }
      };
    }
    halformer::DecodeResult r;
    {
      nb::gil_scoped_release release;
      r = model_->generate(src, o);
    }
    if (callback_error) std::rethrow_exception(callback_error);
    return {std::move(r.tokens), std::move(r.token_logprobs)};
  }

  // Beam search. Returns (hypotheses [B][beam], scores [B][beam]), best first.
  std::pair<std::vector<std::vector<Sequence>>, std::vector<std::vector<double>>> beam_search(
      const IdArray& ids, const OffsetArray& offsets, int beam_size, double length_penalty,
      int max_new_tokens) const {
    auto src = unpack(ids, offsets);
    halformer::BeamResult r;
    {
      nb::gil_scoped_release release;
      r = model_->beam_search(src, beam_size, length_penalty, max_new_tokens);
    }
    return {std::move(r.hypotheses), std::move(r.scores)};
  }

 private:
  std::unique_ptr<halformer::Model> model_;
};

// The continuous-batching engine (halformer/engine.h) over a loaded model; the model
// object is kept alive by the binding (keep_alive). halformer/engine.py runs its loop.
class NativeEngine {
 public:
  NativeEngine(const NativeModel& m, int max_sequences, int max_len, int prefill_tokens, double kv_cache_mb)
      : engine_(m.model(), halformer::EngineOptions{max_sequences, max_len, prefill_tokens, kv_cache_mb}) {}
  int64_t submit(const std::vector<int32_t>& prompt, const halformer::GenerationOptions& o,
                 const std::vector<std::vector<int32_t>>& stop) {
    return engine_.submit(prompt, o, stop);
  }
  bool cancel(int64_t id) { return engine_.cancel(id); }
  // (id, token, finished, reason, logprob) per event; half: 0 the whole step, 1 admit(), 2 decode()
  std::vector<std::tuple<int64_t, int32_t, bool, std::string, float>> step(int half) {
    std::vector<halformer::EngineEvent> events;
    {
      nb::gil_scoped_release release;
      events = half == 1 ? engine_.admit() : half == 2 ? engine_.decode() : engine_.step();
    }
    std::vector<std::tuple<int64_t, int32_t, bool, std::string, float>> out;
    for (auto& e : events) out.emplace_back(e.id, e.token, e.finished, std::move(e.reason), e.logprob);
    return out;
  }
  bool idle() const { return engine_.idle(); }
  int running() const { return engine_.running(); }
  int waiting() const { return engine_.waiting(); }
  int max_len() const { return engine_.options().max_len; }
  std::map<std::string, int64_t> stats() const {
    const halformer::EngineStats st = engine_.stats();
    return {{"blocks", st.blocks}, {"blocks_in_use", st.blocks_in_use}, {"blocks_cached", st.blocks_cached},
            {"block_bytes", st.block_bytes}, {"preemptions", st.preemptions}, {"prefix_tokens", st.prefix_tokens}};
  }

 private:
  halformer::Engine engine_;
};

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "halformer's native binding (use the `halformer` package, not this module)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.attr("DESCRIPTOR_VERSION") = halformer::kDescriptorVersion;
  m.def("open_library", [](const std::string& path) { open_library(path); }, nb::arg("path"),
        "dlopen()s a model library; ValueError when it is not one.");

  using GO = halformer::GenerationOptions;
  nb::class_<GO>(m, "GenerationOptions")
      .def(nb::init<>())
      .def_rw("max_new_tokens", &GO::max_new_tokens)
      .def_rw("beam_size", &GO::beam_size)
      .def_rw("length_penalty", &GO::length_penalty)
      .def_rw("sampling_topk", &GO::sampling_topk)
      .def_rw("sampling_topp", &GO::sampling_topp)
      .def_rw("sampling_temperature", &GO::sampling_temperature)
      .def_rw("seed", &GO::seed)
      .def_rw("repetition_penalty", &GO::repetition_penalty)
      .def_rw("no_repeat_ngram_size", &GO::no_repeat_ngram_size)
      .def_rw("min_length", &GO::min_length)
      .def_rw("return_scores", &GO::return_scores)
      .def_rw("use_cache", &GO::use_cache);
  m.def("validate", [](const GO& o, int vocab) { halformer::validate(o, vocab); }, nb::arg("options"),
        nb::arg("vocab"), "Raises ValueError naming the first generation option out of range.");

  nb::class_<NativeModel>(m, "Model")
      .def(nb::init<const std::string&, const std::string&, const std::string&, int>(), nb::arg("library"),
           nb::arg("weights"), nb::arg("device"), nb::arg("threads"))
      .def("config", &NativeModel::config)
      .def_prop_ro("devices", &NativeModel::devices)
      .def_prop_ro("device", &NativeModel::device)
      .def_prop_ro("threads", &NativeModel::threads)
      .def("encode", &NativeModel::encode)
      .def("pooled", &NativeModel::pooled)
      .def("score", &NativeModel::score)
      .def("generate", &NativeModel::generate, nb::arg("ids"), nb::arg("offsets"), nb::arg("options"),
           nb::arg("on_token").none())
      .def("beam_search", &NativeModel::beam_search);

  nb::class_<NativeEngine>(m, "Engine")
      .def(nb::init<const NativeModel&, int, int, int, double>(), nb::arg("model"), nb::arg("max_sequences"),
           nb::arg("max_len"), nb::arg("prefill_tokens"), nb::arg("kv_cache_mb"), nb::keep_alive<1, 2>())
      .def("submit", &NativeEngine::submit, nb::arg("prompt"), nb::arg("options"), nb::arg("stop"))
      .def("cancel", &NativeEngine::cancel, nb::arg("id"))
      .def("step", &NativeEngine::step, nb::arg("half") = 0)
      .def_prop_ro("idle", &NativeEngine::idle)
      .def_prop_ro("running", &NativeEngine::running)
      .def_prop_ro("waiting", &NativeEngine::waiting)
      .def_prop_ro("max_len", &NativeEngine::max_len)
      .def("stats", &NativeEngine::stats);

  using Tok = halformer::BertTokenizer;
  nb::class_<Tok>(m, "BertTokenizer")
      .def_static("from_vocab_file", [](const std::string& path) { return Tok::from_vocab_file(path); })
      .def("encode", &Tok::encode, nb::arg("text"), nb::arg("max_length"))
      .def("encode_batch",
           [](const Tok& t, const std::vector<std::string>& texts, int max_length) {
             nb::gil_scoped_release release;
             return t.encode_batch(texts, max_length);
           },
           nb::arg("texts"), nb::arg("max_length"))
      .def("tokenize", &Tok::tokenize, nb::arg("text"))
      .def("id", &Tok::id, nb::arg("token"))
      .def("token", &Tok::token, nb::arg("id"))
      .def_prop_ro("vocab_size", &Tok::vocab_size)
      .def_prop_ro("cls_id", &Tok::cls_id)
      .def_prop_ro("sep_id", &Tok::sep_id)
      .def_prop_ro("unk_id", &Tok::unk_id)
      .def_prop_ro("pad_id", &Tok::pad_id);
}
