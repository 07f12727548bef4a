// The continuous-batching engine (halformer/engine.h) against each request run alone
// (Model::generate on that one prompt with the same options): every request's tokens
// must be identical -- greedy and seeded sampling, and their log-probabilities bit for bit
// -- while requests arrive at different steps, outnumber the slots (so they queue and take
// freed slots), have different prompt lengths and lengths of answer, and end by eos,
// length or a stop sequence -- also with a
// pool of blocks so small that sequences are preempted and recomputed, and with prompts
// that share prefixes (their blocks shared). Also: every block is back in the pool after
// each run; submit and cancel from another thread while one steps; cancellation of queued
// and running requests frees their slots and blocks,
// 1,000 queued requests drain, and bad requests / models are refused by name. Two models: gpt-tiny (fp32,
// learned positions) and the GGUF test model gguf-q8 (rotary, grouped-query attention,
// q8_0 weights, bf16 cache). Compiled at test time against both libraries
// (tests/generation/CMakeLists.txt).
//   usage: engine_alone GPT_TINY_WEIGHTS GGUF_Q8_WEIGHTS REVERSE_TINY_WEIGHTS
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gguf-q8.h"
#include "gpt-tiny.h"
#include "halformer/engine.h"
#include "halformer/error.h"
#include "reverse-tiny.h"

using halformer::Sequence;

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

struct Job {
  Sequence prompt;
  halformer::GenerationOptions options;
  std::vector<Sequence> stop;
  int arrives = 0;  // the step before which it is submitted
};

std::string str(const Sequence& s) {
  std::string out;
  for (int32_t t : s) out += (out.empty() ? "" : " ") + std::to_string(t);
  return "[" + out + "]";
}

// A request's answer: its tokens and, with return_scores, their log-probabilities.
struct Answer {
  Sequence tokens;
  std::vector<float> logprobs;
};

// The same float bits: the logits behind them were summed alike.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return "token " + std::to_string(i + 1) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
  return std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " values";
}

// Runs `jobs` through an engine (submitting each before its step), checks each against
// `want` (its answer alone, cut by its stop sequences) and that every block is free again;
// returns the engine's stats.
halformer::EngineStats run_engine(const halformer::Model& m, const std::string& name, const std::vector<Job>& jobs,
               const std::vector<Answer>& want, halformer::EngineOptions eo) {
  halformer::Engine engine(m, eo);
  std::map<int64_t, size_t> job_of;
  std::vector<Answer> got(jobs.size());
  std::vector<int> finished(jobs.size(), 0);
  int step = 0, max_running = 0;
  for (size_t next = 0; next < jobs.size() || !engine.idle(); ++step) {
    for (; next < jobs.size() && jobs[next].arrives <= step; ++next)
      job_of[engine.submit(jobs[next].prompt, jobs[next].options, jobs[next].stop)] = next;
    for (const auto& e : engine.step()) {
      const size_t j = job_of.at(e.id);
      check(!finished[j], name + ": job " + std::to_string(j) + " got an event after it finished");
      if (e.token >= 0) got[j].tokens.push_back(e.token), got[j].logprobs.push_back(e.logprob);
      finished[j] += e.finished;
    }
    max_running = std::max(max_running, engine.running());
    if (step > 10000) break;
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    check(finished[j] == 1, name + ": job " + std::to_string(j) + " finished " + std::to_string(finished[j]) + " times");
    check(got[j].tokens == want[j].tokens, name + ": job " + std::to_string(j) + " (prompt " + str(jobs[j].prompt) +
                                               ") engine " + str(got[j].tokens) + ", alone " + str(want[j].tokens));
    if (jobs[j].options.return_scores && got[j].tokens == want[j].tokens)
      check(same_bits(got[j].logprobs, want[j].logprobs),
            name + ": job " + std::to_string(j) + ": the same tokens with other log-probabilities than alone (" +
                first_difference(got[j].logprobs, want[j].logprobs) + ")");
  }
  const halformer::EngineStats st = engine.stats();
  std::printf("%s: %zu requests, %d slots (at most %d running), %d blocks, %d steps, %lld preemptions, %lld prompt "
              "tokens shared: every request's tokens (and log-probabilities) equal its own run alone\n",
              name.c_str(), jobs.size(), eo.max_sequences, max_running, st.blocks, step, (long long)st.preemptions,
              (long long)st.prefix_tokens);
  if (eo.max_sequences <= 3) check(max_running == eo.max_sequences, name + ": the slots were never all busy");
  check(st.blocks_in_use == 0, name + ": " + std::to_string(st.blocks_in_use) + " blocks still in use after the run");
  return st;
}

// Each job alone (Model::generate), cut after the first stop sequence its tokens end with.
std::vector<Answer> alone(const halformer::Model& m, const std::vector<Job>& jobs) {
  std::vector<Answer> want;
  for (const Job& j : jobs) {
    const halformer::DecodeResult r = m.generate({j.prompt}, j.options);
    Sequence t = r.tokens[0];
    for (size_t n = 1; n <= t.size(); ++n) {
      bool stop = false;
      for (const Sequence& s : j.stop)
        stop = stop || (n >= s.size() && std::equal(s.begin(), s.end(), t.begin() + long(n - s.size())));
      if (stop) {
        t.resize(n);
        break;
      }
    }
    std::vector<float> lp = j.options.return_scores ? r.token_logprobs[0] : std::vector<float>(t.size(), std::nanf(""));
    lp.resize(t.size());
    want.push_back({t, lp});
  }
  return want;
}

// ids: the prompt's (an encoder-decoder's source) id range; max_new: the most new tokens
// a job asks for (an encoder-decoder's requests need more than 16 to span two blocks).
void check_model(const halformer::Model& m, const std::string& name, std::pair<int, int> ids, int max_new) {
  const bool enc_dec = m.config().arch == halformer::Architecture::EncoderDecoder;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> id(ids.first, ids.second), len(1, 23), new_tokens(1, max_new);
  std::vector<Job> jobs;
  for (int j = 0; j < 14; ++j) {
    Job job;
    for (int i = len(rng); i > 0; --i) job.prompt.push_back(id(rng));
    job.options.max_new_tokens = new_tokens(rng);
    // reverse-tiny answers at most 15 tokens (it was trained on short sources): most of its
    // jobs may not end before max_new_tokens, so that they span blocks.
    if (enc_dec && j % 4 != 0) job.options.min_length = job.options.max_new_tokens;
    if (j % 2) {  // seeded sampling; the even jobs are greedy
      job.options.sampling_topk = j % 3 == 0 ? 0 : 20;
      job.options.sampling_topp = j % 5 == 0 ? 0.9f : 1.0f;
      job.options.sampling_temperature = 0.8f;
      job.options.seed = uint64_t(1000 + j);
    }
    if (j == 4) job.options.repetition_penalty = 1.3f;
    job.options.return_scores = j % 7 != 3;  // and compared bit for bit; two jobs without
    job.arrives = j < 5 ? 0 : (j - 4) * 2;  // five at once, then one every two steps
    jobs.push_back(job);
  }
  std::vector<Answer> want = alone(m, jobs);
  // A stop sequence from inside job 6's own answer (tokens 2-3): it ends there.
  if (want[6].tokens.size() >= 4) jobs[6].stop = {{999999}, {want[6].tokens[1], want[6].tokens[2]}};
  want = alone(m, jobs);
  halformer::EngineOptions eo;
  eo.max_sequences = 3;
  eo.prefill_tokens = 16;  // at most one long prompt a step
  run_engine(m, name, jobs, want, eo);
  eo.max_sequences = 8;
  const halformer::EngineStats roomy = run_engine(m, name + " (8 slots)", jobs, want, eo);
  check(roomy.preemptions == 0, name + ": preempted with room for every slot's max_len");
  // A pool of 5 blocks for 8 slots (the longest request needs 3): sequences are preempted,
  // prefilled again and their tokens replayed. (Encoder-decoder: 3 blocks; its requests
  // start in one block each, and outputs of more than 16 tokens need a second.)
  const int pool = enc_dec ? 3 : 5;
  eo.kv_cache_mb = ((pool + 0.5) * double(roomy.block_bytes)) / double(1 << 20);
  const halformer::EngineStats small =
      run_engine(m, name + " (8 slots, " + std::to_string(pool) + " blocks)", jobs, want, eo);
  check(small.blocks == pool, name + ": the budget gave " + std::to_string(small.blocks) + " blocks, not " + std::to_string(pool));
  check(small.preemptions > 0, name + ": a pool of " + std::to_string(pool) + " blocks preempted nothing");

  // Prompts that start alike (a shared 37-token system prompt, then each its own question;
  // two of them identical): the prefix's full blocks are computed once, then shared.
  std::vector<Job> chat;
  Sequence system;
  for (int i = 0; i < 37; ++i) system.push_back(id(rng));
  for (int j = 0; j < 6; ++j) {
    Job job;
    job.prompt = system;
    for (int i = j == 5 ? 3 : 1 + j; i > 0; --i) job.prompt.push_back(j == 5 ? chat[2].prompt[size_t(37 + 3 - i)] : id(rng));
    job.options.max_new_tokens = 6;
    if (j % 2) job.options.sampling_topk = 20, job.options.seed = uint64_t(77 + j);
    job.arrives = j == 0 ? 0 : 3 + j;  // the first one's prompt is in its blocks by then
    chat.push_back(job);
  }
  eo = halformer::EngineOptions();
  eo.max_sequences = 4;
  const halformer::EngineStats shared = run_engine(m, name + " (shared prefixes)", chat, alone(m, chat), eo);
  // An encoder-decoder's decoder prompt is its start token alone: nothing to share.
  if (!enc_dec)
    check(shared.prefix_tokens >= 5 * 32, name + ": only " + std::to_string(shared.prefix_tokens) +
                                           " prompt tokens were shared (want 2 blocks of each of 5 prompts)");
}

void check_cancel_and_queue(const halformer::Model& m) {
  halformer::EngineOptions eo;
  eo.max_sequences = 2;
  halformer::Engine e(m, eo);
  halformer::GenerationOptions o;
  o.max_new_tokens = 20;
  const int64_t a = e.submit({5, 6, 7}, o), b = e.submit({8, 9}, o), c = e.submit({10}, o);
  e.step();
  check(e.running() == 2 && e.waiting() == 1, "cancel: two running, one waiting");
  check(e.cancel(a) && e.cancel(c) && !e.cancel(a) && !e.cancel(12345), "cancel: known ids once, unknown never");
  int cancelled = 0;
  for (const auto& ev : e.step()) cancelled += ev.finished && ev.reason == "cancelled";
  check(cancelled == 2 && e.running() == 1 && e.waiting() == 0, "cancel: both ended, their slot freed");
  while (!e.idle()) e.step();
  check(!e.cancel(b), "cancel: a finished request");
  check(e.stats().blocks_in_use == 0, "cancel: blocks still in use");

  // A stop sequence matches the new tokens only: one that would end with the prompt's last
  // token and the first new one does not stop the request there.
  const int32_t first = m.generate({{5, 6, 7}}, o).tokens[0][0];
  const int64_t spanning = e.submit({5, 6, 7}, o, {{7, first}});
  std::string reason;
  while (!e.idle())
    for (const auto& ev : e.step())
      if (ev.id == spanning && ev.finished) reason = ev.reason;
  check(reason != "stop", "stop sequence: matched across the prompt and the first new token");

  // 1,000 queued requests drain, each ending once.
  o.max_new_tokens = 2;
  for (int i = 0; i < 1000; ++i) e.submit({int32_t(3 + i % 200), 4}, o);
  int ended = 0, steps = 0;
  while (!e.idle() && steps < 100000) {
    for (const auto& ev : e.step()) ended += ev.finished;
    ++steps;
  }
  std::printf("1000 queued requests: all %d ended in %d steps\n", ended, steps);
  check(ended == 1000, "1000 queued requests: " + std::to_string(ended) + " ended");
}

// submit() and cancel() from another thread while this one steps (engine.h): every
// request ends exactly once, those not cancelled with their tokens alone.
void check_submit_while_stepping(const halformer::Model& m) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> id(3, m.config().tgt_vocab - 1), len(1, 12), new_tokens(1, 10);
  std::vector<Job> jobs(40);
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int i = len(rng); i > 0; --i) jobs[j].prompt.push_back(id(rng));
    jobs[j].options.max_new_tokens = new_tokens(rng);
    if (j % 2) jobs[j].options.sampling_topk = 10, jobs[j].options.seed = 500 + j;
  }
  const std::vector<Answer> want = alone(m, jobs);
  halformer::EngineOptions eo;
  eo.max_sequences = 4;
  halformer::Engine engine(m, eo);
  std::vector<int64_t> ids(jobs.size(), 0);
  std::vector<bool> cancel_asked(jobs.size(), false);
  std::atomic<bool> submitted{false};
  std::thread submitter([&] {
    for (size_t j = 0; j < jobs.size(); ++j) {
      ids[j] = engine.submit(jobs[j].prompt, jobs[j].options);
      if (j % 9 == 4) cancel_asked[j] = engine.cancel(ids[j]);  // true unless it ended already
      std::this_thread::sleep_for(std::chrono::microseconds(50 * (j % 4)));
    }
    submitted = true;
  });
  std::map<int64_t, Answer> got;
  std::map<int64_t, std::vector<std::string>> endings;
  // Bounded by time, not by steps: on a loaded machine the submitter may start late, and
  // a cap of 100,000 idle steps once ran out before its first submit (40 "ended 0 times").
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((!submitted || !engine.idle()) && std::chrono::steady_clock::now() < deadline) {
    if (engine.idle()) std::this_thread::yield();
    for (const auto& e : engine.step()) {
      if (e.token >= 0) got[e.id].tokens.push_back(e.token);
      if (e.finished) endings[e.id].push_back(e.reason);
    }
  }
  submitter.join();
  int cancelled = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const std::vector<std::string>& end = endings[ids[j]];
    check(end.size() == 1, "submit while stepping: request " + std::to_string(j) + " ended " + std::to_string(end.size()) + " times");
    if (end.size() != 1) continue;
    if (end[0] == "cancelled") {
      check(cancel_asked[j], "submit while stepping: request " + std::to_string(j) + " cancelled unasked");
      ++cancelled;
    } else {
      check(got[ids[j]].tokens == want[j].tokens, "submit while stepping: request " + std::to_string(j) + " engine " +
                                                      str(got[ids[j]].tokens) + ", alone " + str(want[j].tokens));
    }
  }
  std::printf("submit and cancel from another thread while stepping: %zu requests, %d cancelled, the rest as alone\n",
              jobs.size(), cancelled);
  check(engine.stats().blocks_in_use == 0, "submit while stepping: blocks still in use");
}

template <typename F>
void expect_error(const std::string& what, const std::string& needle, F f) {
  try {
    f();
    check(false, what + ": no error");
  } catch (const halformer::Error& e) {
    check(std::string(e.what()).find(needle) != std::string::npos, what + ": error '" + e.what() + "' lacks '" + needle + "'");
    std::printf("refused (%s): %s\n", what.c_str(), e.what());
  }
}

// A batch large enough that the runtime takes its feed-forward and encoder self-attention
// blocks in chunks of rows (runtime/layers.cpp kChunkRows: 40 sequences of 16 rows, 640 rows,
// go in three chunks) encodes every sequence to the bits it gets alone.
void check_encoder_chunks(const halformer::Model& m) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> id(1, 13);
  std::vector<Sequence> src(40);
  for (Sequence& s : src)
    for (int t = 0; t < 16; ++t) s.push_back(id(rng));
  const halformer::Tensor all = m.encode(src);
  const size_t per = all.data.size() / src.size();
  int differ = 0;
  for (size_t b = 0; b < src.size(); ++b) {
    const halformer::Tensor one = m.encode({src[b]});
    check(one.data.size() == per, "encoder chunks: sequence " + std::to_string(b) + " has another size alone");
    if (one.data.size() == per && std::memcmp(one.data.data(), all.data.data() + b * per, per * sizeof(float)) != 0) ++differ;
  }
  check(differ == 0, "encoder chunks: " + std::to_string(differ) + " of 40 sequences differ from their encoding alone");
  std::printf("encoder in chunks: 40 sequences of 16 tokens, each bit for bit as alone\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s GPT_TINY_WEIGHTS GGUF_Q8_WEIGHTS REVERSE_TINY_WEIGHTS\n", argv[0]);
    return 2;
  }
  try {
    auto gpt = halformer::Model::load(*halformer_model_gpt_tiny(), argv[1], {2, "cpu"});
    auto q8 = halformer::Model::load(*halformer_model_gguf_q8(), argv[2], {2, "cpu"});
    auto rev = halformer::Model::load(*halformer_model_reverse_tiny(), argv[3], {2, "cpu"});
    check_model(gpt, "gpt-tiny", {3, gpt.config().tgt_vocab - 1}, 12);
    check_model(q8, "gguf-q8", {3, q8.config().tgt_vocab - 1}, 12);
    check_model(rev, "reverse-tiny", {1, 13}, 40);  // digits 1-13 (14, 15: bos, eos)
    check_cancel_and_queue(gpt);
    check_submit_while_stepping(gpt);
    check_encoder_chunks(rev);
    halformer::Engine e(gpt);
    halformer::GenerationOptions o;
    expect_error("empty prompt", "empty", [&] { e.submit({}, o); });
    expect_error("id out of range", "512", [&] { e.submit({5, 512}, o); });
    o.max_new_tokens = 120;
    expect_error("too long", "max_len 128", [&] { e.submit(Sequence(10, 5), o); });
    o.max_new_tokens = 4;
    expect_error("empty stop", "stop sequence 1", [&] { e.submit({5}, o, {{}}); });
    halformer::EngineOptions bad;
    bad.max_sequences = 0;
    expect_error("no slots", "max_sequences 0", [&] { halformer::Engine(gpt, bad); });
    halformer::Engine rev_engine(rev);
    expect_error("a source id out of range", "16", [&] { rev_engine.submit({3, 16}, o); });
    o.max_new_tokens = 65;
    expect_error("an encoder-decoder's max_new_tokens past max_len", "max_len 64", [&] { rev_engine.submit({3, 4}, o); });
    o.max_new_tokens = 4;
    bad = halformer::EngineOptions();
    bad.kv_cache_mb = 1e-6;
    expect_error("budget below a block", "holds no block", [&] { halformer::Engine(gpt, bad); });
    const double block_mb = double(e.stats().block_bytes) / double(1 << 20);
    bad.kv_cache_mb = 2.0 * double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) / double(1 << 20);
    expect_error("a budget beyond the machine's memory", "more than this machine's", [&] { halformer::Engine(gpt, bad); });
    // 2.5 GiB in each layer's pool (one Halide buffer): refused by name, unless the whole
    // is already more than this machine has.
    const double ram_mb = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)) / double(1 << 20);
    bad.kv_cache_mb = 2560.0 * double(gpt.config().decoder_layers);
    expect_error("a layer's pool past 2 GiB", bad.kv_cache_mb < ram_mb ? "2048 MiB per layer" : "more than this machine's",
                 [&] { halformer::Engine(gpt, bad); });
    bad.kv_cache_mb = 3e9 * block_mb;
    expect_error("more blocks than int32 ids", "addressable", [&] { halformer::Engine(gpt, bad); });
    bad.kv_cache_mb = 2.5 * double(e.stats().block_bytes) / double(1 << 20);
    halformer::Engine tiny(gpt, bad);
    o.max_new_tokens = 30;
    expect_error("a request larger than the pool", "raise kv_cache_mb", [&] { tiny.submit(Sequence(10, 5), o); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::printf("engine vs alone: %d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
