// The tokenizer a GGUF file carries (tokenizer.ggml.*), written out as files the rest of
// halformer already reads, so that text needs the .gguf alone (docs/import.md, "The
// tokenizer of a GGUF file"):
//
//   tokenizer.ggml.model "llama" (SentencePiece BPE: tokens, scores, token types)
//     W.tokenizer.model  a SentencePiece ModelProto for the binary's --spm (Debian's
//                        libsentencepiece encodes with it as with the model's own file)
//     W.tokenizer.json   what transformers 4.30's LlamaConverter makes of that model, for
//                        Python's halformer.Model(..., tokenizer=)
//   "gpt2" (byte-level BPE: tokens, merges, tokenizer.ggml.pre naming the pre-tokenizer)
//     W.tokenizer.json   only: the binary has no byte-level BPE
//   anything else, or no tokenizer.ggml.model: no files, one notice
//
// W is the weights path without its extension (by default the spec's path), so that an
// import's outputs sit together and follow --weights-out.
//
// Design: the GGUF holds exactly what its converter (llama.cpp's convert_hf_to_gguf.py) read
// from the model's tokenizer, so both files are rebuilt from it rather than guessed: the
// SentencePiece model is serialized by a small protobuf wire encoder (Debian ships no
// sentencepiece_model.pb.h; field numbers from sentencepiece_model.proto), the BPE merges
// of the JSON come from the pieces and their scores as transformers' SentencePieceExtractor
// derives them. Malformed tokenizer metadata (a list of another length than the
// vocabulary, a token type outside 1-6, merges naming unknown tokens, ids out of range) is
// an error naming the key, like every other key of the file: llama.cpp refuses such a file
// too, and a tokenizer that silently cuts text differently is a different model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "importer.h"

namespace halformer::import {

class GgufFile;

// Reads tokenizer.ggml.* of `f` (a vocabulary of `vocab` ids; the model named `name`, its
// weights at `weights_abs`), adds the tokenizer files to out.files, their lines to
// `header` (the spec's header comment: the --spm / tokenizer= lines to use) and any notice
// to out.notes. Throws ImportError listing every problem ("FILE: key 'K': ...").
void add_gguf_tokenizer(const GgufFile& f, int64_t vocab, const std::string& name, const std::string& weights_abs,
                        std::vector<std::string>& header, Imported& out);

}  // namespace halformer::import
