// Fuzzing the readers of telemetry.sqlite. A short `octet train` run writes a real database; every case
// mutates a copy of it with a seeded generator (bytes flipped, the file cut short, SQL that plants values of
// every type in every column, drops or renames tables and columns, adds rows) and reads it:
//   - in-process, in a forked child under a time limit: inspect_run and write_report (thousands of cases);
//   - through the real binary: octet inspect (text, and --json --layer), octet report (a few hundred).
// Each reader must end in success or in one invalid_input line that names the file (exit code 0 or 2),
// never a signal, an internal error or a hang; the database and its directory must be left exactly as they
// were, except for the page report writes when it succeeds. A failing case prints its seed; rerun it alone
// with OCTET_FUZZ_CASE_SEED=<seed>. OCTET_FUZZ_SEED, OCTET_FUZZ_CASES and OCTET_FUZZ_BINARY_CASES change the
// base seed and the number of cases.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "octet/check.h"
#include "octet/telemetry/inspect.h"
#include "octet/telemetry/report.h"
#include "process.h"
#include "telemetry_fixture.h"
#include "files.h"

extern char** environ;

namespace octet {
namespace {

namespace fs = std::filesystem;
using Rng = std::mt19937_64;

constexpr unsigned kCaseSeconds = 10;  // a reader that takes longer has hung

uint64_t env_number(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 0) : fallback;
}

// The database written by a short real run, made once for all cases.
struct Seed {
  fs::path root;
  std::string bytes;
  std::vector<std::string> layers;
};

const Seed& seed_database() {
  static const Seed seed = [] {
    Seed s;
    s.root = fs::temp_directory_path() / ("octet-fuzz-" + std::to_string(getpid()));
    fs::remove_all(s.root);
    fs::create_directories(s.root / "text");
    std::vector<std::string> args = {"data",  "prepare", "--tokenizer",
                                     "bytes", "--out",   (s.root / "shards").string()};
    for (int d = 0; d < 20; ++d) {
      const fs::path file = s.root / "text" / ("doc" + std::to_string(100 + d) + ".txt");
      std::ofstream out(file);
      for (int i = 0; i < 40; ++i)
        out << "The quick brown fox " << (d * 7 + i) % 13 << " jumps over the lazy dog.\n";
      args.push_back(file.string());
    }
    testing::ProcessResult r = testing::run_octet(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const fs::path run = s.root / "run";
    const fs::path config = s.root / "run.toml";
    // Static scaling with a scale too large for the LayerNorm outputs: saturation alerts move layers to BF16,
    // so that the database has events and GEMM rows after the start besides every step's rows.
    std::ofstream(config)
        << "[model]\nvocab_size = 256\nmax_seq_len = 16\nlayers = 1\nheads = 2\nchannels = 32\n"
        << "[train]\nmixed_precision = \"fp8\"\nbatch_size = 2\nseq_len = 16\nsteps = 8\n"
        << "[fp8]\nrecipe = \"static\"\nstatic_scale = 1e3\non_alert = \"bf16_layer\"\n"
        << "[scheduler]\nwarmup_steps = 1\n[data]\ndir = \"" << (s.root / "shards").string()
        << "\"\neval_every = 2\neval_batches = 1\n[logging]\nrun_dir = \"" << run.string()
        << "\"\nlog_every = 4\n[telemetry]\ninterval = 2\n";
    r = testing::run_octet({"train", config.string()});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    s.bytes = testing::file_bytes(run / "telemetry.sqlite");
    const InspectReport report = inspect_run(run, {});
    for (const LayerRanking& l : report.saturation) s.layers.push_back(l.layer);
    s.layers.push_back("h.0.mlp.c_proj");
    s.layers.push_back("no.such.layer");
    return s;
  }();
  return seed;
}

// Removes the seed's directory when the tests are done.
class RemoveSeed : public ::testing::Environment {
 public:
  void TearDown() override {
    fs::remove_all(fs::temp_directory_path() / ("octet-fuzz-" + std::to_string(getpid())));
  }
};
const auto* const kRemoveSeed = ::testing::AddGlobalTestEnvironment(new RemoveSeed);

struct Column {
  const char* table;
  const char* name;
};
constexpr Column kColumns[] = {
    {"run", "key"},
    {"run", "value"},
    {"steps", "step"},
    {"steps", "loss"},
    {"steps", "learning_rate"},
    {"steps", "grad_norm"},
    {"steps", "loss_scale"},
    {"steps", "skipped"},
    {"steps", "skip_reason"},
    {"steps", "tokens"},
    {"steps", "step_ms"},
    {"steps", "tokens_per_s"},
    {"steps", "fp8_gemms"},
    {"steps", "other_gemms"},
    {"validation", "step"},
    {"validation", "loss"},
    {"tensor_stats", "step"},
    {"tensor_stats", "layer"},
    {"tensor_stats", "tensor"},
    {"tensor_stats", "amax"},
    {"tensor_stats", "scale"},
    {"tensor_stats", "saturated_fraction"},
    {"tensor_stats", "underflow_fraction"},
    {"tensor_stats", "sqnr_db"},
    {"gemms", "layer"},
    {"gemms", "gemm"},
    {"gemms", "mode"},
    {"gemms", "reason"},
    {"gemms", "since_step"},
    {"phases", "step"},
    {"phases", "phase"},
    {"phases", "ms"},
    {"events", "id"},
    {"events", "step"},
    {"events", "kind"},
    {"events", "layer"},
    {"events", "tensor"},
    {"events", "value"},
    {"events", "threshold"},
    {"events", "message"},
};
constexpr const char* kTables[] = {"run", "steps", "validation", "tensor_stats", "gemms", "phases", "events"};

// Values of every type SQLite stores, and the edges of every rule a reader applies.
constexpr const char* kValues[] = {
    "NULL",
    "0",
    "1",
    "-1",
    "2",
    "0.5",
    "1.5",
    "-0.0",
    "1e-320",
    "1e300",
    "1e999",
    "-1e999",
    "9223372036854775807",
    "-9223372036854775808",
    "1000000000001",
    "9007199254740993",
    "'abc'",
    "''",
    "'NaN'",
    "'inf'",
    "'1e5'",
    "'fp8'",
    "'activation'",
    "'forward'",
    "'h.0.attn.c_attn'",
    "x''",
    "x'00ff'",
    "randomblob(64)",
    "zeroblob(5000)",
    "printf('%.*c', 70000, 'x')",
    "printf('%.*c', 300, 'y')",
    "char(10) || 'two lines' || char(27) || '[31m'",
    "'</script><script>alert(1)</script>'",
    "char(55357)",
    "cast(x'c3' as text)",
    "'[]'",
    "'{}'",
    "'[1, 2]'",
    "'[{\"layer\": 5}]'",
    "'[{\"layer\": [1]}]'",
    "printf('%.*c', 100000, '[')",
    "'[{\"layer\": \"a\", \"forward\": \"fp8\"}]'",
};

std::string pick(Rng& rng, const auto& pool) {
  return pool[rng() % std::size(pool)];
}

std::string sql_mutation(Rng& rng) {
  const Column& c = kColumns[rng() % std::size(kColumns)];
  const std::string value = pick(rng, kValues);
  switch (rng() % 12) {
    case 0:
      return fmt::format("UPDATE {} SET \"{}\" = {}", c.table, c.name, value);
    case 1:
      return fmt::format("DROP TABLE {}", pick(rng, kTables));
    case 2:
      return fmt::format("ALTER TABLE {} DROP COLUMN \"{}\"", c.table, c.name);
    case 3:
      return fmt::format("ALTER TABLE {} RENAME COLUMN \"{}\" TO renamed", c.table, c.name);
    case 4:
      return fmt::format("DELETE FROM {}", pick(rng, kTables));
    case 5:
      return fmt::format(
          "INSERT INTO {0} SELECT * FROM {0} LIMIT 3; UPDATE {0} SET \"{1}\" = {2} WHERE rowid = "
          "(SELECT MAX(rowid) FROM {0})",
          c.table, c.name, value);
    case 6:
      return fmt::format(
          "UPDATE run SET value = {} WHERE key = '{}'", value,
          pick(rng, std::array{"precision_map", "config", "mode", "name", "telemetry_interval"}));
    case 7:
      return fmt::format("DROP TABLE {0}; CREATE TABLE {0}(x)", pick(rng, kTables));
    default:
      return fmt::format(
          "UPDATE {0} SET \"{1}\" = {2} WHERE rowid IN (SELECT rowid FROM {0} ORDER BY random() "
          "LIMIT {3})",
          c.table, c.name, value, 1 + rng() % 3);
  }
}

// Mutates RUN_DIR/telemetry.sqlite (a copy of the seed) and says how.
std::string mutate(Rng& rng, const fs::path& file, const std::string& seed_bytes) {
  std::string bytes = seed_bytes;
  std::string how;
  const uint64_t kind = rng() % 100;
  if (kind >= 30) {
    std::ofstream(file, std::ios::binary) << bytes;
    const int statements = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < statements; ++i) {
      std::string sql = sql_mutation(rng);
      if (rng() % 8 == 0)
        sql = "PRAGMA journal_mode = DELETE; " + sql;  // a database SQLite left in another mode
      const std::string error = testing::execute_sql(file, sql);
      how += (how.empty() ? "" : "; ") + sql.substr(0, 160) + (error.empty() ? "" : " (" + error + ")");
    }
    bytes = testing::file_bytes(file);
    if (kind < 85) return how;
  }
  if (bytes.empty()) return how + "; empty";
  if (kind < 15 || kind >= 85) {
    const int flips = 1 + static_cast<int>(rng() % 8);
    how += (how.empty() ? "" : "; ") + std::string("flipped bytes at");
    for (int i = 0; i < flips; ++i) {
      const size_t at = rng() % 4 == 0 ? rng() % std::min<size_t>(100, bytes.size()) : rng() % bytes.size();
      bytes[at] = static_cast<char>(bytes[at] ^ static_cast<char>(1 + rng() % 255));
      how += ' ';  // (not " " + to_string: GCC 12 warns of a memcpy overlap that cannot happen there)
      how += std::to_string(at);
    }
  } else {
    const size_t size = rng() % 2 == 0 ? (rng() % (bytes.size() / 4096 + 1)) * 4096 : rng() % bytes.size();
    bytes.resize(size);
    how += (how.empty() ? "" : "; ") + std::string("cut to ") + std::to_string(size) + " bytes";
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  return how;
}

std::map<std::string, std::string> snapshot(const fs::path& dir) {
  return testing::directory_snapshot(dir);
}

struct Outcome {
  int exit_code = -1;  // -1: killed by a signal
  int signal = 0;
  std::string message;  // standard error, or the error's message in-process
  std::string out;
};

// Reads the case in a forked child: inspect_run, then write_report; the child reports each outcome through a
// pipe as "CODE\tMESSAGE\n". SIGALRM ends a child that hangs.
std::vector<Outcome> read_in_child(const fs::path& dir, const std::string& layer) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm(kCaseSeconds);
    std::string said;
    auto attempt = [&said](auto&& read) {
      try {
        read();
        said += "0\t\n";
      } catch (const Error& e) {
        said += std::to_string(e.exit_code()) + "\t" + e.what() + "\n";
      } catch (const std::exception& e) {
        said += std::string("1\tinternal error: ") + e.what() + "\n";
      }
    };
    attempt([&] { inspect_run(dir, {}); });
    attempt([&] {
      InspectOptions options;
      options.layer = layer;
      inspect_run(dir, options);
    });
    attempt([&] { telemetry::write_report({dir, std::nullopt, {}}); });
    const ssize_t ignored = write(fds[1], said.data(), said.size());
    (void)ignored;
    _exit(0);
  }
  close(fds[1]);
  std::string said;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) said.append(buffer, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::vector<Outcome> outcomes;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Outcome o;
    o.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    o.message = "the child ended with status " + std::to_string(status) + " after: " + said;
    return {o};
  }
  size_t at = 0;
  for (size_t end; (end = said.find('\n', at)) != std::string::npos; at = end + 1) {
    const std::string line = said.substr(at, end - at);
    const size_t tab = line.find('\t');
    outcomes.push_back({std::atoi(line.substr(0, tab).c_str()), 0, line.substr(tab + 1), ""});
  }
  if (at != said.size()) outcomes.push_back({-1, 0, "a message with a line break: " + said.substr(at), ""});
  return outcomes;
}

// Runs the binary with a time limit (SIGALRM ends a hang).
Outcome run_binary(const std::vector<std::string>& args) {
  const testing::ProcessResult r = testing::run_octet_limited(args, {kCaseSeconds, 0});
  return {r.exit_code, r.term_signal, r.err, r.out};
}

class TelemetryFuzz : public ::testing::Test {
 protected:
  // One case: a directory holding the mutated database.
  fs::path case_dir(uint64_t case_seed) {
    const fs::path dir = seed_database().root / "case";
    fs::remove_all(dir);
    fs::create_directories(dir);
    Rng rng(case_seed);
    description_ = mutate(rng, dir / "telemetry.sqlite", seed_database().bytes);
    layer_ = seed_database().layers[rng() % seed_database().layers.size()];
    return dir;
  }

  void failed(uint64_t case_seed, const std::string& what) {
    if (++failures_ <= 20) {
      ADD_FAILURE() << "case seed " << case_seed << " (rerun with OCTET_FUZZ_CASE_SEED=" << case_seed
                    << "): " << what << "\n  mutation: " << description_;
    }
  }

  // The seeds of the cases to run: OCTET_FUZZ_CASE_SEED alone, or `count` derived from the base seed.
  static std::vector<uint64_t> case_seeds(const char* count_variable, uint64_t count, uint64_t salt) {
    if (const uint64_t only = env_number("OCTET_FUZZ_CASE_SEED", 0); only != 0) return {only};
    Rng base(env_number("OCTET_FUZZ_SEED", 20261126) ^ salt);
    std::vector<uint64_t> seeds(env_number(count_variable, count));
    for (uint64_t& s : seeds) s = base() | 1;
    return seeds;
  }

  std::string description_;
  std::string layer_;
  int failures_ = 0;
};

TEST_F(TelemetryFuzz, InProcessReadersEndInSuccessOrOneLineAndWriteNothingElse) {
  ASSERT_FALSE(seed_database().bytes.empty());
  std::map<int, int> outcomes;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<uint64_t> seeds = case_seeds("OCTET_FUZZ_CASES", 2000, 0);
  for (const uint64_t case_seed : seeds) {
    const fs::path dir = case_dir(case_seed);
    const std::string file = (dir / "telemetry.sqlite").string();
    const auto before = snapshot(dir);
    const std::vector<Outcome> results = read_in_child(dir, layer_);
    if (results.size() != 3) {
      failed(case_seed, results.empty() ? "no outcome" : results[0].message);
      continue;
    }
    for (size_t i = 0; i < results.size(); ++i) {
      const Outcome& r = results[i];
      const char* reader = i == 0 ? "inspect" : i == 1 ? "inspect --layer" : "report";
      ++outcomes[r.exit_code];
      if (r.exit_code != 0 && r.exit_code != 2)
        failed(case_seed, fmt::format("{}: exit code {}: {}", reader, r.exit_code, r.message));
      if (r.exit_code == 2 && r.message.find(file) == std::string::npos && r.message.find("--layer") != 0)
        failed(case_seed, fmt::format("{}: the message does not name the file: {}", reader, r.message));
    }
    auto after = snapshot(dir);
    const bool wrote_page = after.erase("report.html") == 1;
    if (wrote_page != (results[2].exit_code == 0))
      failed(case_seed, fmt::format("report exited with {} and {} a page", results[2].exit_code,
                                    wrote_page ? "wrote" : "did not write"));
    if (after != before) failed(case_seed, "the run directory changed");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu in-process cases in %.1f s; reader outcomes: %d succeeded, %d refused\n", seeds.size(),
              seconds, outcomes[0], outcomes[2]);
  if (seeds.size() >= 100) {
    EXPECT_GT(outcomes[0], static_cast<int>(seeds.size() / 10))
        << "the mutations (or the readers) are too strict";
    EXPECT_GT(outcomes[2], static_cast<int>(seeds.size() / 10)) << "the mutations are too gentle";
  }
}

TEST_F(TelemetryFuzz, TheBinaryEndsInExit0Or2WithOneLineAndWritesNothingElse) {
  ASSERT_FALSE(seed_database().bytes.empty());
  std::map<int, int> outcomes;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<uint64_t> seeds = case_seeds("OCTET_FUZZ_BINARY_CASES", 200, 0x9e3779b97f4a7c15ULL);
  for (const uint64_t case_seed : seeds) {
    const fs::path dir = case_dir(case_seed);
    const auto before = snapshot(dir);
    const std::vector<std::vector<std::string>> commands = {
        {"inspect", dir.string()},
        {"inspect", dir.string(), "--json", "--layer", layer_},
        {"report", dir.string()},
    };
    Outcome report;
    for (const auto& command : commands) {
      const Outcome r = run_binary(command);
      const std::string what = fmt::format("octet {}", fmt::join(command, " "));
      ++outcomes[r.exit_code];
      if (r.signal != 0) failed(case_seed, fmt::format("{}: killed by signal {}", what, r.signal));
      if (r.exit_code != 0 && r.exit_code != 2)
        failed(case_seed, fmt::format("{}: exit code {}: {}", what, r.exit_code, r.message));
      if (r.exit_code == 2 && (r.out != "" || std::count(r.message.begin(), r.message.end(), '\n') != 1))
        failed(case_seed,
               fmt::format("{}: refused with output '{}' and '{}'", what, r.out.substr(0, 200), r.message));
      if (r.exit_code == 0 && command.size() > 2 && command[2] == "--json" && !nlohmann::json::accept(r.out))
        failed(case_seed, what + ": not one JSON document");
      if (command[0] == "report") report = r;
    }
    auto after = snapshot(dir);
    const bool wrote_page = after.erase("report.html") == 1;
    if (wrote_page != (report.exit_code == 0))
      failed(case_seed, fmt::format("report exited with {} and {} a page", report.exit_code,
                                    wrote_page ? "wrote" : "did not write"));
    if (after != before) failed(case_seed, "the run directory changed");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu cases through the binary in %.1f s; commands: %d exit 0, %d exit 2\n", seeds.size(),
              seconds, outcomes[0], outcomes[2]);
}

}  // namespace
}  // namespace octet
