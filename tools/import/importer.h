// `halformer import`: a spec from a Hugging Face model directory (config.json +
// model.safetensors, optionally a sentence-transformers layout around it), or from a
// llama.cpp GGUF file (import_gguf: the spec and a canonical weights file).
//
// Design: the importer only writes specs the current spec language can express exactly.
// Each config field is either mapped to a spec field (the spec says which in a comment),
// known not to change the outputs (dropout, use_cache, ...), or refused: a value the
// spec cannot express is an error naming the field and the value, never a silently
// different model. Every problem is reported at once. The family table (model_type ->
// preset, architectures -> head) is in families.cpp, each group's reader in encoders.cpp,
// decoders.cpp, llama.cpp or seq2seq.cpp (import_internal.h lists the files); docs/import.md lists
// what is refused and why.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace halformer::import {

struct Imported {
  std::string yaml;                 // the spec, commented, ready for `halformer build`
  std::string weights;              // the safetensors file the spec's preset reads
  // config.json's model_type, one of the 19 supported: bert, roberta, xlm-roberta, electra,
  // albert, distilbert (encoders); gpt2, gptj, opt, gpt_neox, llama, mistral, qwen2, gemma
  // (decoders); bart, marian, mbart, t5, mt5 (encoder-decoders).
  std::string family;
  std::string preset;               // e.g. "huggingface-bert"
  std::vector<std::string> inputs;  // every file read (the output must be none of them)
  // GGUF imports only (import_gguf): the spec's precision ("int4" or "fp32"), notices for
  // the user (what was dequantized), and the writer of the weights file, to be called
  // once the spec has been checked (nothing is written before).
  std::string precision;
  std::vector<std::string> notes;
  std::function<void()> write_weights;
  // Other files to write, path (absolute) and contents: the GGUF's tokenizer beside the
  // weights (gguf_tokenizer.h). Under the spec's rules: never an input, an existing file
  // only with --force, written after the weights and before the spec.
  std::vector<std::pair<std::string, std::string>> files;
};

// Every reason the directory cannot be imported, each "FILE: field: found VALUE; why".
struct ImportError : std::runtime_error {
  explicit ImportError(std::vector<std::string> p);
  std::vector<std::string> problems;
};

// Reads DIR (config.json, the safetensors header, and where present modules.json and the
// sentence-transformers module configs, the tokenizer's special tokens) and returns the
// spec named `name`. Throws ImportError.
Imported import_directory(const std::string& dir, const std::string& name);

// Whether `path` names a GGUF file: it ends in ".gguf", or is a file that starts with the
// GGUF magic.
bool is_gguf(const std::string& path);

// Reads the GGUF file (general.architecture llama, qwen2, gemma or gpt2;
// tools/import/gguf_import.cpp, gguf_archs.cpp) and returns the spec named `name`, whose
// weights are `weights_out`: a safetensors file under halformer's canonical names that
// Imported::write_weights writes (Q4_0 layer linears as halformer's int4 blocks when all of
// them are Q4_0, the rest F32). Every problem ("FILE: key 'K': ..." / "FILE: tensor 'T':
// ...") is checked before it returns. Throws ImportError.
Imported import_gguf(const std::string& gguf_path, const std::string& name, const std::string& weights_out);

// A spec name ([A-Za-z0-9_-]+) from a file name: its stem, other characters as '-'.
std::string name_from_path(const std::string& path);

}  // namespace halformer::import
