// Mixed-script text on which the tokenizer tests compare octet's ids with independent encoders (GPT-2's
// gpt-3-encoder, Llama 3's llama3-tokenizer-js and Hugging Face's tokenizers library, all in JavaScript).
#pragma once

#include <string_view>

namespace octet::testing {

// Prose, contractions in either case, numbers, code, runs of spaces, tabs and line breaks (CRLF too),
// accented Latin, Greek, Cyrillic, CJK, Korean, Arabic and Hebrew letters, emoji with modifiers and joiners,
// combining marks, digits of other scripts and Unicode spaces. Left out: U+0085 and U+FEFF (JavaScript's \s
// differs from Unicode's White_Space in those two), "'ſ" (llama3-tokenizer-js spells the contractions' case
// out in ASCII; tiktoken folds ſ to s) and special tokens' spellings, which each test adds for its tokenizer.
inline constexpr std::string_view kMixedScriptText =
    "Hello world! The quick brown fox jumps over the lazy dog.\n"
    "It's, they're, we've, I'm, you'll, he'd; don't. DON'T IT'S We'Re THEY'LL she'D 'tis' ''quoted'' "
    "x's\n"
    "Numbers: 0 7 42 1961 3.14159 -273.15 1,000,000 2^10=1024 #1 $5 50% 12th 0x1F 12345678901234567890\n"
    "int main(int argc, char** argv) {\n    for (size_t i = 0; i < n; ++i) x[i] += y[i] * 2;\n"
    "    return argc > 1 ? EXIT_FAILURE : 0;  // done\n}\n"
    "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2], \"b\": None}\n"
    "Whitespace:  two  spaces,\tone\ttab,\t\ttwo tabs, trailing spaces   \n"
    "\n\n\nthree blank lines, then a line of spaces\n      \nand CRLF\r\nend\r\n  \r\n\r\n x\n"
    "Punctuation: ... !!! ??? --- (parens) [brackets] {braces} <angle> \"quotes\" `tick` "
    "@#%&*+=|\\/~^_\n"
    "Caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 Stra\xC3\x9F"
    "e \xC3\x85ngstr\xC3\xB6m fa\xC3\xA7"
    "ade \xC3\x89L\xC3\x88VE\n"
    "Greek: \xCE\x93\xCE\xB5\xCE\xB9\xCE\xAC \xCF\x83\xCE\xBF\xCF\x85 "
    "\xCE\xBA\xCF\x8C\xCF\x83\xCE\xBC\xCE\xB5 "
    "\xCE\xB1\xCE\xB2\xCE\xB3 \xCF\x80=3.14\n"
    "Cyrillic: \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80!\n"
    "CJK: \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82 "
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 "
    "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xE9\x95\x87\n"
    "Emoji: \xF0\x9F\x99\x82 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
    "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9"
    "\xE2\x80\x8D\xF0\x9F\x91\xA7 \xE2\x9D\xA4\xEF\xB8\x8F!! \xF0\x9F\xA6\x99Llama\n"
    "Combining: e\xCC\x81 a\xCC\x88o\xCC\x88 n\xCC\x83 \xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D"
    "\xE0\xA4\xA6\xE0\xA5\x80\n"
    "Digits: \xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4 \xE2\x85\xA0\xE2\x85\xA1 \xC2\xBD \xE2\x91\xA0 "
    "\xEF\xBC\x91\xEF\xBC\x92\n"
    "Spaces: a\xC2\xA0"
    "b c\xE2\x80\x83"
    "d e\xE3\x80\x80"
    "f g\xE2\x80\xA8h\n"
    "Arabic: \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 Hebrew: "
    "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D\n"
    "   leading spaces and trailing ones \t \n  ";

}  // namespace octet::testing
