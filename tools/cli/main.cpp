// halformer: the command-line front end.
//   halformer check SPEC...       validate specs (all problems, file:line:column)
//   halformer check --print-defaults   the spec's defaults as JSON (docs/spec.md)
//   halformer plan  SPEC --out D  write the build plan (used by halformer_add_model)
//   halformer build SPEC -o DIR   generate + compile every layer, link DIR/<name>
//                 [--db FILE | --no-db]   tuning database (default: the spec's tuning.db)
//   halformer tune  SPEC ...      search schedules (runs halformer-tune; docs/tuning.md)
//   halformer import HF_DIR|MODEL.gguf -o SPEC [--name N] [--weights-out W] [--force]
//                                 a spec from a Hugging Face model directory, or from a
//                                 GGUF file with its weights (tools/import; docs/import.md)
//   halformer quantize SPEC W -o OUT [--precision P] [--force]   W in the int8 / bf16
//                                 formats the spec's build reads (docs/precision.md)
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <vector>

#include "halformer/packed_layout.h"
#include "halformer/weights.h"
#include "importer.h"
#include "output_text.h"
#include "plan.h"
#include "spec.h"
#include "tuning_db.h"

namespace fs = std::filesystem;
using namespace halformer;

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// The spec's precision names ("fp32", "bf16", "fp16", "int8", "q8_0", "int4": halformer/enums.h).
std::vector<std::string> precision_names() {
  std::vector<std::string> names;
  for (const auto& [p, name] : enum_names(Precision{})) names.emplace_back(name);
  return names;
}

// Parses, validates and checks that the spec can be built; prints every problem.
// `halformer build --precision P` replaces the spec's `precision:` (its
// precision_overrides stay); the plan step, run by CMake, gets it as HALFORMER_PRECISION.
std::optional<Spec> load(const std::string& path, bool quiet_ok = false) {
  ParseResult r = parse_spec_file(path);
  for (const auto& d : r.diagnostics) std::cerr << d.str() << "\n";
  if (!r.ok()) return std::nullopt;
  if (const char* p = std::getenv("HALFORMER_PRECISION"); p && *p) {
    const auto precision = parse_precision(p);
    if (!precision) {
      std::string names;
      for (const auto& n : precision_names()) names += (names.empty() ? "" : ", ") + n;
      std::cerr << "halformer: HALFORMER_PRECISION '" << p << "' is not one of " << names << "\n";
      return std::nullopt;
    }
    r.spec->precision = *precision;
  }
  auto unsupported = check_supported(*r.spec);
  for (const auto& d : unsupported) std::cerr << d.str() << "\n";
  if (!unsupported.empty()) return std::nullopt;
  if (!quiet_ok) std::cout << path << ": ok (" << r.spec->name << ", " << to_string(r.spec->architecture) << ")\n";
  return r.spec;
}

std::error_code& ec_ignore() {
  static std::error_code ec;
  return ec;
}

// Runs argv (no shell) and waits for it; stdout and stderr go to `log` when given.
// Ctrl-C reaches the child through the terminal's process group; this process ignores it
// while waiting, so it returns only once the child (ninja, after stopping its own jobs
// and removing their partial outputs) has exited -- never with a build still running.
int run(const std::vector<std::string>& argv, const std::string& log = "") {
  struct sigaction ignore {}, old_int {}, old_quit {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGQUIT, &ignore, &old_quit);
  std::cout << std::flush;
  std::cerr << std::flush;
  const pid_t pid = fork();
  if (pid == 0) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGQUIT, &old_quit, nullptr);
    if (!log.empty()) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(127);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "halformer: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  if (pid < 0) {
    std::cerr << "halformer: cannot start " << argv[0] << ": " << std::strerror(errno) << "\n";
    status = -1;
  } else {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

// One build per output directory at a time. The lock is an flock on DIR/.halformer/lock,
// inherited by the build's processes, so it stays held until the last of them exits
// (even if this process is killed first); a second build waits for it.
void lock_output_dir(const fs::path& proj) {
  const std::string path = (proj / "lock").string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT, 0644);  // kept open until exit
  if (fd < 0) {
    std::cerr << "[halformer] warning: cannot open " << path << " (" << std::strerror(errno)
              << "); not guarding against a concurrent build in this directory\n";
    return;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return;
  std::cout << "[halformer] another build is using " << proj.parent_path().string() << "; waiting for it to finish"
            << std::endl;
  while (flock(fd, LOCK_EX) < 0 && errno == EINTR) {
  }
}

// ptxas, for the CUDA kernels' check (tools/ptxas_check.py, run by the build):
// PATH, then $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin. "" when none.
std::string find_ptxas() {
  std::vector<fs::path> dirs;
  std::string path = env_or("PATH", "");
  for (size_t b = 0, e; b <= path.size(); b = e + 1) {
    e = path.find(':', b);
    if (e == std::string::npos) e = path.size();
    if (e > b) dirs.emplace_back(path.substr(b, e - b));
  }
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* v = std::getenv(var); v && *v) dirs.push_back(fs::path(v) / "bin");
  dirs.emplace_back("/usr/local/cuda/bin");
  for (const auto& d : dirs) {
    fs::path p = d / "ptxas";
    std::error_code ec;
    if (fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0) return fs::absolute(p, ec).string();
  }
  return "";
}

// A tiny CMake project per model; halformer_add_model() does the work, reusing the
// generators and runtime this halformer build already compiled.
// db_flag: "" (the spec's tuning.db), a path (--db) or "none" (--no-db).
int build(const Spec& spec, const std::string& spec_path, const std::string& out_dir, int jobs,
          const std::string& db_flag) {
  const std::string build_dir = env_or("HALFORMER_BUILD_DIR", HALFORMER_BUILD_DIR);
  const std::string source_dir = env_or("HALFORMER_SOURCE_DIR", HALFORMER_SOURCE_DIR);
  fs::path out = fs::absolute(out_dir), proj = out / ".halformer";
  // Never write over the user's spec: the outputs are DIR/<name> and DIR/lib<name>.a.
  for (const fs::path& target : {out / spec.name, out / ("lib" + spec.name + ".a")}) {
    std::error_code ec;
    if (fs::exists(target, ec) && fs::equivalent(target, spec_path, ec)) {
      std::cerr << "halformer build: output " << target.string() << " is the spec itself; choose another -o directory\n";
      return 1;
    }
  }
  fs::create_directories(proj);
  lock_output_dir(proj);
  // Tuning database: say here what the plan step (run by CMake, output not shown) will do.
  std::string db_env;
  if (db_flag == "none")
    db_env = "none";
  else if (!db_flag.empty())
    db_env = fs::absolute(db_flag).lexically_normal().string();
  if (!db_env.empty())
    setenv("HALFORMER_TUNING_DB", db_env.c_str(), 1);
  else
    unsetenv("HALFORMER_TUNING_DB");
  const tune::DbSource db = tune::resolve_db(spec);
  {
    Plan preview = make_plan(spec);
    for (const auto& line : tune::apply_tuning(preview, db, HALFORMER_HALIDE_PLUGIN_DIR))
      std::cout << "[halformer] " << line << "\n";
    if (const std::string memory = memory_summary(spec); !memory.empty())
      std::cout << "[halformer] " << memory << "\n";
    std::cout << std::flush;  // before CMake's output
  }
  std::error_code ec;
  std::ostringstream cm;
  cm << "# Generated by `halformer build` -- do not edit.\n"
     << "cmake_minimum_required(VERSION 3.28)\n"
     << "project(halformer_model_" << spec.name << " LANGUAGES C CXX)\n"
     << "set(HALFORMER_BUILD_DIR \"" << build_dir << "\")\n";
  // `halformer plan` (run at configure time) reads the database choice from the environment.
  if (!db_env.empty()) cm << "set(ENV{HALFORMER_TUNING_DB} \"" << db_env << "\")\n";
  if (const char* p = std::getenv("HALFORMER_PRECISION"); p && *p) cm << "set(ENV{HALFORMER_PRECISION} \"" << p << "\")\n";
  cm << "# precision: " << to_string(spec.precision) << "\n";
  cm << "# tuning database: " << (db.path.empty() ? "none" : db.path)
     << (db.path.empty() ? "" : fs::exists(db.path, ec) ? " (present)" : " (absent)") << "\n"
     << "include(\"" << source_dir << "/cmake/Halformer.cmake\")\n";
  // CUDA kernels: checked with ptxas by the build (no spills, occupancy in DIR/ptxas.json).
  // Looked up on every build, so that installing CUDA later turns the check on.
  if (spec.has_target(Target::Cuda)) {
    const std::string ptxas = find_ptxas();
    if (ptxas.empty())
      std::cout << "[halformer] ptxas not found (PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda/bin): the CUDA "
                   "kernels are not checked for spills or occupancy\n" << std::flush;
    cm << "set(HALFORMER_PTXAS \"" << ptxas << "\")  # \"\": no ptxas found\n";
  }
  cm << "halformer_add_model(" << spec.name << " SPEC \"" << fs::absolute(spec_path).string()
     << "\" OUTPUT_DIR \"" << out.string() << "\")\n";
  write_if_changed(proj / "CMakeLists.txt", cm.str());
  const std::string cmake = HALFORMER_CMAKE;
  fs::path bdir = proj / "build";
  if (!fs::exists(bdir / "build.ninja")) {
    const std::string log = (proj / "configure.log").string();
    std::cout << "[halformer] configuring " << spec.name << " in " << bdir.string() << std::endl;
    if (run({cmake, "-S", proj.string(), "-B", bdir.string(), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             std::string("-DCMAKE_MAKE_PROGRAM=") + HALFORMER_MAKE_PROGRAM,
             std::string("-DHalide_DIR=") + HALFORMER_HALIDE_DIR},
            log) != 0) {
      std::cerr << "halformer build: configure failed; see " << log << "\n";
      std::ifstream in(log);
      std::cerr << in.rdbuf();
      return 1;
    }
  }
  // Ninja itself, not `cmake --build`: CMake exits on Ctrl-C at once, while ninja waits for
  // its jobs and removes their partial outputs; waiting for ninja means a re-run never
  // races the interrupted one.
  std::vector<std::string> b = {HALFORMER_MAKE_PROGRAM, "-C", bdir.string()};
  if (jobs > 0) b.insert(b.end(), {"-j", std::to_string(jobs)});
  if (run(b) != 0) {
    std::cerr << "halformer build: build of " << spec.name << " failed (see the messages above)\n";
    return 1;
  }
  std::cout << "[halformer] built " << (out / spec.name).string() << " and "
            << (out / ("lib" + spec.name + ".a")).string() << "\n";
  return 0;
}

// Whether `cmd` may write the file `out`: never one of its inputs or a directory, and an
// existing file only with --force (nothing a user wrote is replaced unasked).
bool may_write(const char* cmd, const std::string& out, const std::vector<std::string>& inputs, bool force) {
  std::error_code ec;
  for (const auto& input : inputs)
    if (fs::exists(out, ec) && fs::equivalent(out, input, ec)) {
      std::cerr << cmd << ": output " << out << " is the input " << input << "; refusing to overwrite it\n";
      return false;
    }
  if (fs::is_directory(out, ec)) {
    std::cerr << cmd << ": output " << out << " is a directory; give the file to write\n";
    return false;
  }
  if (fs::exists(out, ec) && !force) {
    std::cerr << cmd << ": " << out << " exists; add --force to replace it\n";
    return false;
  }
  return true;
}

// `halformer import`: writes the spec only when it is new (or --force), never over one of
// the files it read, and only after the spec compiler accepted it. A GGUF file also gets
// its weights file (`weights_out`, default: the spec's path with .safetensors) and its
// tokenizer files beside it (import::Imported::files), under the same rules, written before
// the spec.
int import_model(const std::string& src, const std::string& out, std::string name, std::string weights_out,
                 bool force) {
  if (name.empty()) name = import::name_from_path(out);
  if (name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos) {
    std::cerr << "halformer import: --name '" << name
              << "' is not a valid name: use only letters, digits, '_' and '-'\n";
    return 1;
  }
  const bool gguf = import::is_gguf(src);
  if (!gguf && !weights_out.empty()) {
    std::cerr << "halformer import: --weights-out applies to GGUF files; a Hugging Face directory's weights are read "
                 "as they are\n";
    return 1;
  }
  if (gguf && weights_out.empty()) weights_out = fs::path(out).replace_extension(".safetensors").string();
  import::Imported imp;
  try {
    imp = gguf ? import::import_gguf(src, name, weights_out) : import::import_directory(src, name);
  } catch (const import::ImportError& e) {
    std::cerr << "halformer import: cannot import " << src << " (" << e.problems.size()
              << (e.problems.size() == 1 ? " problem" : " problems") << "):\n";
    for (const auto& p : e.problems) std::cerr << "  " << p << "\n";
    return 1;
  }
  if (!may_write("halformer import", out, imp.inputs, force)) return 1;
  if (gguf) {
    if (fs::absolute(weights_out).lexically_normal() == fs::absolute(out).lexically_normal()) {
      std::cerr << "halformer import: the weights file " << weights_out << " is the spec " << out
                << "; give another --weights-out\n";
      return 1;
    }
    if (!may_write("halformer import", weights_out, imp.inputs, force)) return 1;
  }
  // Other outputs (a GGUF's tokenizer files): the same rules, and none of them the spec or
  // the weights.
  for (const auto& [path, text] : imp.files) {
    const fs::path p = fs::absolute(path).lexically_normal();
    if (p == fs::absolute(out).lexically_normal() || (gguf && p == fs::absolute(weights_out).lexically_normal())) {
      std::cerr << "halformer import: the output " << path << " is also the spec or the weights file; give another "
                << (gguf ? "--weights-out (the tokenizer files are named after it)" : "-o") << "\n";
      return 1;
    }
    if (!may_write("halformer import", path, imp.inputs, force)) return 1;
  }
  // The importer only writes what the spec compiler accepts; anything else is a bug here.
  ParseResult parsed = parse_spec_string(imp.yaml, out);
  std::vector<Diagnostic> problems = parsed.diagnostics;
  if (parsed.ok())
    for (auto& d : check_supported(*parsed.spec)) problems.push_back(d);
  if (!problems.empty()) {
    std::cerr << "halformer import: internal error: the imported spec does not check:\n";
    for (const auto& d : problems) std::cerr << "  " << d.str() << "\n";
    std::cerr << imp.yaml;
    return 1;
  }
  if (fs::path parent = fs::path(out).parent_path(); !parent.empty()) fs::create_directories(parent);
  if (imp.write_weights) {
    if (fs::path parent = fs::path(weights_out).parent_path(); !parent.empty()) fs::create_directories(parent);
    for (const auto& note : imp.notes) std::cout << "halformer import: " << note << "\n";
    std::cout << "halformer import: writing " << weights_out << "...\n" << std::flush;
    try {
      imp.write_weights();
    } catch (const import::ImportError& e) {
      std::cerr << "halformer import: cannot import " << src << ":\n";
      for (const auto& p : e.problems) std::cerr << "  " << p << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "halformer import: " << e.what() << "\n";
      return 1;
    }
  }
  // Each file whole or not at all: written aside, then renamed over the name.
  auto write_file = [](const std::string& path, const std::string& text) {
    const fs::path tmp = fs::path(path).concat(".tmp-import");
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    if (!f.flush()) {
      std::cerr << "halformer import: cannot write " << tmp.string() << ": " << std::strerror(errno) << "\n";
      std::error_code ec;
      fs::remove(tmp, ec);
      return false;
    }
    f.close();
    fs::rename(tmp, path);
    return true;
  };
  for (const auto& [path, text] : imp.files) {
    if (fs::path parent = fs::path(path).parent_path(); !parent.empty()) fs::create_directories(parent);
    if (!write_file(path, text)) return 1;
  }
  if (!write_file(out, imp.yaml)) return 1;
  if (gguf)
    std::cout << "halformer import: wrote " << out << " (" << name << ", GGUF " << imp.family << ", precision "
              << imp.precision << ") and " << weights_out << "\n";
  else
    std::cout << "halformer import: wrote " << out << " (" << name << ", " << imp.family << ", preset " << imp.preset
              << ")\n";
  for (const auto& file : imp.files) std::cout << "halformer import: wrote " << file.first << "\n";
  std::cout << "  halformer build " << out << " -o DIR\n  DIR/" << name << " --weights " << imp.weights
            << " --src \"...\"\n";
  return 0;
}

// `halformer quantize`: the spec's weights file, loaded as its build loads it (int8
// quantized per channel, bf16 rounded), written under canonical names so that the
// runtime reads them as they are -- a smaller file and no quantization at load.
int quantize(const Spec& spec, const std::string& weights, const std::string& out, bool force) {
  if (!may_write("halformer quantize", out, {weights}, force)) return 1;
  auto mc = model_config(spec);
  const ModelConfig& c = mc->config;
  if (c.layer_weights == Precision::Fp32 && c.generator_weights == Precision::Fp32 &&
      c.embedding_weights == Precision::Fp32) {
    std::cerr << "halformer quantize: " << spec.name << " is fp32 throughout: nothing to quantize (give "
              << "--precision int8, q8_0, int4 or bf16, or set the spec's precision)\n";
    return 1;
  }
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::cout << "halformer quantize: reading " << weights << " (" << c.preset_name << ")...\n" << std::flush;
  // The file is written in torch's layout whatever the packed one: any panel width does.
  const Weights w = load_weights(c, weights, WeightLayout{});
  const auto t1 = clock::now();
  std::cout << "halformer quantize: writing " << out << " (layers " << enum_name(c.layer_weights) << ", output "
            << enum_name(c.generator_weights) << ", embeddings " << enum_name(c.embedding_weights) << ")...\n"
            << std::flush;
  save_weights(c, w, out);
  const auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  const double mb_in = double(fs::file_size(weights)) / 1e6, mb_out = double(fs::file_size(out)) / 1e6;
  std::cout << "halformer quantize: wrote " << out << ": " << std::fixed << std::setprecision(1) << mb_out << " MB ("
            << std::setprecision(2) << mb_out / mb_in << " x " << std::setprecision(1) << mb_in << " MB) in "
            << secs(t0, clock::now()) << " s (read " << secs(t0, t1) << " s)\n  use it as --weights with a "
            << enum_name(c.layer_weights) << " build of " << spec.name << "\n";
  return 0;
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{"halformer: compile a Transformer YAML spec into Halide kernels and an inference binary"};
  app.require_subcommand(1);

  std::vector<std::string> check_specs;
  bool print_defaults = false;
  auto* check = app.add_subcommand("check", "validate specs; exit 0 when every spec is valid");
  check->add_option("SPEC", check_specs, "spec files");
  check->add_flag("--print-defaults", print_defaults,
                  "print the default of every optional field as JSON (what a spec that omits it gets)");

  std::string plan_spec, plan_out;
  auto* plan = app.add_subcommand("plan", "write the build plan (plan.cmake, <name>_model.cpp)");
  plan->add_option("SPEC", plan_spec)->required();
  plan->add_option("--out", plan_out, "output directory")->required();

  std::string build_spec, build_out;
  int jobs = 0;
  auto* bld = app.add_subcommand("build", "generate and compile every layer, link DIR/<name> and DIR/lib<name>.a");
  bld->add_option("SPEC", build_spec)->required();
  bld->add_option("-o,--out", build_out, "output directory")->required();
  bld->add_option("-j,--jobs", jobs, "parallel compile jobs (default: all cores)");
  std::string build_db;
  bool no_db = false;
  auto* db_opt = bld->add_option("--db", build_db, "tuning database to use (default: the spec's tuning.db)");
  bld->add_flag("--no-db", no_db, "ignore any tuning database: hand schedules only")->excludes(db_opt);
  std::string build_precision;
  bld->add_option("--precision", build_precision, "build at this precision instead of the spec's (docs/precision.md)")
      ->check(CLI::IsMember(precision_names()));

  auto* tune = app.add_subcommand("tune", "search schedules for the spec's kernels on this machine and record them "
                                          "in a tuning database (docs/tuning.md); see `halformer tune --help`");
  tune->prefix_command();
  tune->set_help_flag();  // --help goes to halformer-tune, which knows the options

  std::string import_dir, import_out, import_name, import_weights_out;
  bool import_force = false;
  auto* imp = app.add_subcommand("import", "write a spec for a Hugging Face model directory (config.json + "
                                           "model.safetensors: BERT, GPT-2, Llama, T5 ...), or for a llama.cpp GGUF "
                                           "file (llama, qwen2, gemma, gpt2) with its weights (docs/import.md)");
  imp->add_option("HF_DIR|MODEL.gguf", import_dir,
                  "the model directory (a sentence-transformers directory too), or a GGUF file")
      ->required();
  imp->add_option("-o,--out", import_out, "the spec file to write")->required();
  imp->add_option("--name", import_name, "the spec's name (default: the output file's stem)");
  imp->add_option("--weights-out", import_weights_out,
                  "GGUF: the weights file to write (canonical safetensors; default: the spec's path with .safetensors)");
  imp->add_flag("--force", import_force, "replace existing output files (never one of the inputs)");

  std::string quant_spec, quant_weights, quant_out, quant_precision;
  bool quant_force = false;
  auto* quant = app.add_subcommand("quantize", "write a weights file in the int8 / int4 / bf16 formats the spec's build reads, "
                                               "loaded as it is (docs/precision.md)");
  quant->add_option("SPEC", quant_spec)->required();
  quant->add_option("WEIGHTS", quant_weights, "the model's safetensors weights (as for the fp32 build)")
      ->required()
      ->check(CLI::ExistingFile);
  quant->add_option("-o,--out", quant_out, "the safetensors file to write")->required();
  quant->add_option("--precision", quant_precision, "quantize for this precision instead of the spec's")
      ->check(CLI::IsMember(precision_names()));
  quant->add_flag("--force", quant_force, "replace an existing output file (never the input)");

  CLI11_PARSE(app, argc, argv);

  if (*quant) {
    if (!quant_precision.empty()) setenv("HALFORMER_PRECISION", quant_precision.c_str(), 1);
    auto spec = load(quant_spec, true);
    if (!spec) return 1;
    return quantize(*spec, quant_weights, quant_out, quant_force);
  }
  if (*imp) return import_model(import_dir, import_out, import_name, import_weights_out, import_force);

  if (*check) {
    if (print_defaults && !check_specs.empty()) {
      std::cerr << "halformer check: --print-defaults takes no spec files\n";
      return 2;
    }
    if (print_defaults) {
      std::cout << spec_defaults_json();
      return 0;
    }
    if (check_specs.empty()) {
      std::cerr << "halformer check: give the spec files to check (or --print-defaults)\n";
      return 2;
    }
    int rc = 0;
    for (const auto& s : check_specs) rc |= load(s) ? 0 : 1;
    return rc;
  }
  if (*plan) {
    auto spec = load(plan_spec, true);
    if (!spec) return 1;
    Plan p = make_plan(*spec);
    // Tuning database (HALFORMER_TUNING_DB from `halformer build`, else the spec's tuning.db).
    for (const auto& line : tune::apply_tuning(p, tune::resolve_db(*spec), HALFORMER_HALIDE_PLUGIN_DIR))
      std::cerr << line << "\n";
    write_plan(*spec, p, plan_out);
    return 0;
  }
  if (*tune) {
    // The tuner links libHalide and the generators: a separate program next to this one.
    fs::path self = fs::read_symlink("/proc/self/exe", ec_ignore());
    fs::path tuner = self.parent_path() / "halformer-tune";
    if (!fs::exists(tuner)) tuner = fs::path(env_or("HALFORMER_BUILD_DIR", HALFORMER_BUILD_DIR)) / "bin" / "halformer-tune";
    std::vector<std::string> args{tuner.string()};
    for (const auto& a : tune->remaining()) args.push_back(a);
    std::vector<char*> argv2;
    for (auto& a : args) argv2.push_back(a.data());
    argv2.push_back(nullptr);
    execv(tuner.c_str(), argv2.data());
    std::cerr << "halformer tune: cannot run " << tuner.string() << " (build it: cmake --build build)\n";
    return 1;
  }
  if (!build_precision.empty()) setenv("HALFORMER_PRECISION", build_precision.c_str(), 1);
  auto spec = load(build_spec, true);
  if (!spec) return 1;
  return build(*spec, build_spec, build_out, jobs, no_db ? "none" : build_db);
}

int main(int argc, char** argv) {
  // Filesystem and I/O failures (an output path that is a file, an unwritable
  // directory, ...) end with a message and exit 1, never an uncaught exception.
  try {
    return run_cli(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "halformer: error: " << e.what() << "\n";
    return 1;
  }
}
