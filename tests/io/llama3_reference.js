// The independent reference for octet's Llama 3 tokenizer: the npm package llama3-tokenizer-js's own encode()
// (a JavaScript BPE over Hugging Face's tokenizer.json for Llama 3) applied to a UTF-8 text file as ordinary
// text (no <|begin_of_text|> or <|end_of_text|> added, and special tokens' spellings not treated as special),
// printing {"ids": [...], "special_tokens": [the text of ids 128000..128255]} as JSON.
//   node tests/io/llama3_reference.js <text file> [<npm dir>]
// <npm dir> defaults to ${OCTET_DATA_DIR:-<repo>/.cache/data}/npm, where scripts/fetch_tokenizer.sh installs
// the package. Exits 3 when the package is not installed, so that the caller can tell it from a failure.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length < 3) {
  process.stderr.write('usage: node tests/io/llama3_reference.js <text file> [<npm dir>]\n');
  process.exit(2);
}
const repo = path.resolve(__dirname, '..', '..');
const dataDir = process.env.OCTET_DATA_DIR || path.join(repo, '.cache', 'data');
const npmDir = process.argv[3] || path.join(dataDir, 'npm');
const bundle = path.join(npmDir, 'node_modules', 'llama3-tokenizer-js', 'bundle',
                         'commonjs-llama3-tokenizer-with-baked-data.cjs');
if (!fs.existsSync(bundle)) {
  process.stderr.write(`llama3_reference.js: llama3-tokenizer-js is not installed in ${npmDir} (run scripts/fetch_tokenizer.sh)\n`);
  process.exit(3);
}
const tokenizer = require(bundle).llama3Tokenizer;
const text = fs.readFileSync(process.argv[2], 'utf8');
// A pattern that never matches: no part of the text is taken for a special token.
const ids = tokenizer.encode(text, { bos: false, eos: false, specialTokenRegex: /(?!)/g });
process.stdout.write(JSON.stringify({ ids, special_tokens: tokenizer.vocabById.slice(128000) }) + '\n');
