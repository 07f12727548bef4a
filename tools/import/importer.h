// `halformer import`: a spec from a Hugging Face model directory (config.json +
// model.safetensors, optionally a sentence-transformers layout around it).
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

#include <stdexcept>
#include <string>
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

// A spec name ([A-Za-z0-9_-]+) from a file name: its stem, other characters as '-'.
std::string name_from_path(const std::string& path);

}  // namespace halformer::import
