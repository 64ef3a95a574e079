// The independent reference for octet's GPT-2 tokenizer: the npm package gpt-3-encoder's own encode() (a
// JavaScript port of OpenAI's encoder.py) applied to a UTF-8 text file, printing the token ids as JSON.
//   node tests/io/gpt2_reference.js <text file> [<npm dir>]
// <npm dir> defaults to ${OCTET_DATA_DIR:-<repo>/.cache/data}/npm, where scripts/fetch_tokenizer.sh installs
// the package. Exits 3 when the package is not installed, so that the caller can tell it from a failure.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length < 3) {
  process.stderr.write('usage: node tests/io/gpt2_reference.js <text file> [<npm dir>]\n');
  process.exit(2);
}
const repo = path.resolve(__dirname, '..', '..');
const dataDir = process.env.OCTET_DATA_DIR || path.join(repo, '.cache', 'data');
const npmDir = process.argv[3] || path.join(dataDir, 'npm');
const packageDir = path.join(npmDir, 'node_modules', 'gpt-3-encoder');
if (!fs.existsSync(path.join(packageDir, 'package.json'))) {
  process.stderr.write(`gpt2_reference.js: gpt-3-encoder is not installed in ${npmDir} (run scripts/fetch_tokenizer.sh)\n`);
  process.exit(3);
}
const { encode } = require(packageDir);
const text = fs.readFileSync(process.argv[2], 'utf8');
process.stdout.write(JSON.stringify(encode(text)) + '\n');
