// Internal to src/io: UTF-8 code points and the character classes that the pre-tokenization patterns of the
// BPE tokenizers (GPT-2, Llama 3) are written in: Unicode's letters \p{L}, numbers \p{N} and White_Space \s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace octet::io::unicode {

enum class CharClass : uint8_t { letter, number, space, other };

struct Character {
  CharClass kind;
  uint32_t length;      // bytes of UTF-8
  uint32_t code_point;  // the byte's own value for a byte that does not start a valid sequence
};

// Decodes the UTF-8 sequence at text[pos] strictly (no overlong forms, surrogates or values past U+10FFFF).
// Returns false when the bytes there are not a valid sequence.
bool decode_utf8(std::string_view text, size_t pos, uint32_t& code_point, uint32_t& length);

// Unicode's White_Space property (stable since Unicode 6.3). Python's `regex` and Rust's `regex` use it for
// \s; JavaScript's \s differs in two characters, counting U+FEFF and not U+0085.
bool is_white_space(uint32_t code_point);

// The class of a code point: letter (General_Category L), number (N), White_Space, or other.
CharClass classify(uint32_t code_point);

// The character at text[pos] (pos < text.size()). A byte that does not start a valid UTF-8 sequence counts as
// one character of class `other`, so that any bytes split (and round-trip) without error.
Character character_at(std::string_view text, size_t pos);

// The end of the run of characters of class `kind` that starts at `pos`.
size_t run_end(std::string_view text, size_t pos, CharClass kind);

}  // namespace octet::io::unicode
