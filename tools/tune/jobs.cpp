// Jobs (tuner.h: make_jobs): what is tuned. One job per kernel of the plan, with the
// tuning shapes it is timed at, awkward small shapes it is only checked at, and how often
// the model calls it per encoder pass and per decoded token (the search's priorities and
// the report's sums).
#include <algorithm>
#include <stdexcept>

#include "tuner.h"

namespace halformer::tune {

namespace {

// The role a KernelTable field names (Plan::roles' keys).
KernelRole role_named(const std::string& name) {
  for (const KernelRoleInfo& r : kKernelRoles)
    if (name == r.name) return r.role;
  throw std::logic_error("the plan binds an unknown kernel role '" + name + "'");
}

// Calls per encoder pass ("encode") and per decoded token ("decode") of each plan role;
// the roles not listed count {1, 1} (make_jobs).
std::map<KernelRole, std::pair<double, double>> role_counts(const Spec& s) {
  using R = KernelRole;
  const double enc = double(s.encoder_layers), dec = double(s.decoder_layers);
  const bool cross = s.architecture == halformer::Architecture::EncoderDecoder;
  const bool dec_only = s.architecture == halformer::Architecture::Decoder;
  const double fin = s.final_norm ? 1 : 0;
  std::map<KernelRole, std::pair<double, double>> r{
      {R::embed_src, {1, 0}},
      {R::embed_tgt, {0, 1}},
      {R::qkv, {enc, dec}},
      {R::encoder_self_attention, {enc, 0}},
      {R::decoder_self_attention, {0, dec}},
      {R::cross_attention, {0, cross ? dec : 0}},
      {R::cross_q, {0, cross ? dec : 0}},
      {R::cross_kv, {cross ? dec : 0, 0}},
      {R::attention_out, {enc, dec * (cross ? 2 : 1)}},
      {R::ff1, {enc, dec}},
      {R::ff2, {enc, dec}},
      {R::layer_norm,
       {2 * enc + (enc > 0 ? fin : 0) + (s.embedding_norm ? 1 : 0), (cross ? 3 : 2) * dec + (dec > 0 ? fin : 0)}},
      {R::generator, {0, 1}},
      {R::head, {0, 1}},
      {R::argmax, {0, 1}},
      {R::pool, {1, 0}},
      {R::pooler, {1, 0}},
      {R::classifier, {1, 0}},
  };
  if (s.half_cache()) {  // the decoder's QKV into its 16-bit cache
    r[R::qkv_cache] = {0, dec};
    r[R::qkv].second = 0;
  }
  if (dec_only)  // the prompt runs the decoder over whole sequences
    for (R role : {R::embed_tgt, R::qkv, R::qkv_cache, R::decoder_self_attention, R::attention_out, R::ff1, R::ff2,
                   R::layer_norm})
      r[role].first = r[role].second;
  return r;
}

}  // namespace

std::vector<Job> make_jobs(const Options& o, const Spec& spec, const Plan& plan) {
  std::vector<Job> jobs;
  std::vector<int> seqs = o.seq_lens, batches = o.batch_sizes;
  if (seqs.empty())
    for (auto v : spec.tuning_seq_lens) seqs.push_back(int(v));
  if (batches.empty())
    for (auto v : spec.tuning_batch_sizes) batches.push_back(int(v));
  if (seqs.empty()) seqs = {int(std::min<int64_t>(128, spec.max_len))};
  if (batches.empty()) batches = {1};
  for (int& s : seqs) s = int(std::min<int64_t>(s, spec.max_len));
  const int max_seq = *std::max_element(seqs.begin(), seqs.end());

  const auto counts = role_counts(spec);
  std::mt19937 seed_rng(o.seed);
  for (const auto& k : plan.kernels) {
    if (!o.kernel_filter.empty() && k.function.find(o.kernel_filter) == std::string::npos) continue;
    Job j;
    j.k = &k;
    j.label = k.function;
    j.shape_params = shape_params(k.generator, k.params);
    j.hand_knobs = knob_params(k.generator, k.params);
    for (const auto& [name, fn] : plan.roles) {
      if (fn != k.function) continue;
      const KernelRole role = role_named(name);
      j.roles.push_back(role);
      auto it = counts.find(role);
      if (it == counts.end()) {
        j.counts.first += 1, j.counts.second += 1;
      } else {
        j.counts.first += it->second.first;
        j.counts.second += it->second.second;
      }
    }
    if (j.counts.first == 0 && j.counts.second == 0) j.counts = {1, 1};
    // Pooling runs over whole sequences only: no decode shapes.
    const bool pool = !j.roles.empty() && signature(j.roles.front()) == Signature::PoolFn;
    if (j.counts.first > 0)
      for (int s : seqs)
        for (int b : batches) j.shapes.push_back(Shape{"encode", b, s});
    if (j.counts.second > 0 && !pool)
      for (int b : batches) j.shapes.push_back(Shape{"decode", b, max_seq});
    // Correctness-only shapes: one row, odd row counts, several sequences, short key ranges.
    for (const Shape& e : {Shape{"encode", 1, 1}, Shape{"encode", 1, 3}, Shape{"encode", 2, 5},
                           Shape{"encode", 1, 37}, Shape{"decode", 1, 1}, Shape{"decode", 3, 6}}) {
      Shape x = e;
      x.seq = int(std::min<int64_t>(x.seq, spec.max_len));
      if (pool && x.phase == "decode") continue;
      if (std::find(j.shapes.begin(), j.shapes.end(), x) == j.shapes.end() &&
          std::find(j.edge_shapes.begin(), j.edge_shapes.end(), x) == j.edge_shapes.end())
        j.edge_shapes.push_back(x);
    }
    j.rng.seed(seed_rng());
    jobs.push_back(std::move(j));
  }
  return jobs;
}

}  // namespace halformer::tune
