// Loads a Hugging Face tokenizer directory (tokenizer.json and tokenizer_config.json, as `octet export
// --format hf` writes them) with Hugging Face's tokenizers library for JavaScript (@huggingface/tokenizers,
// an implementation independent of octet's), encodes each UTF-8 text file as transformers' tokenizer(text)
// does (special tokens added by the post-processor, special tokens' spellings in the text taken as those
// tokens), decodes the ids back with and without the special tokens, and prints
//   [{"ids": [...], "decoded": "...", "decoded_without_special": "..."}, ...]   one object per file
// as JSON.
//   node tests/io/hf_tokenizer_reference.js <npm dir> <tokenizer dir> <text file>...
// <npm dir> is where scripts/fetch_tokenizer.sh installs the package (${OCTET_DATA_DIR:-<repo>/.cache/data}/npm).
// Exits 3 when the package is not installed, so that the caller can tell it from a failure.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length < 5) {
  process.stderr.write('usage: node tests/io/hf_tokenizer_reference.js <npm dir> <tokenizer dir> <text file>...\n');
  process.exit(2);
}
const [npmDir, tokenizerDir, ...textFiles] = process.argv.slice(2);
// The CommonJS build, named by its file: the package's main entry is an ES module.
const bundle = path.join(npmDir, 'node_modules', '@huggingface', 'tokenizers', 'dist', 'tokenizers.cjs');
if (!fs.existsSync(bundle)) {
  process.stderr.write(`hf_tokenizer_reference.js: @huggingface/tokenizers is not installed in ${npmDir} (run scripts/fetch_tokenizer.sh)\n`);
  process.exit(3);
}
const { Tokenizer } = require(path.resolve(bundle));
const readJson = (name) => JSON.parse(fs.readFileSync(path.join(tokenizerDir, name), 'utf8'));
const tokenizer = new Tokenizer(readJson('tokenizer.json'), readJson('tokenizer_config.json'));

const results = textFiles.map((file) => {
  const text = fs.readFileSync(file, 'utf8');
  const ids = tokenizer.encode(text).ids;
  return {
    ids,
    decoded: ids.length > 0 ? tokenizer.decode(ids) : '',
    decoded_without_special: ids.length > 0 ? tokenizer.decode(ids, { skip_special_tokens: true }) : '',
  };
});
process.stdout.write(JSON.stringify(results) + '\n');
