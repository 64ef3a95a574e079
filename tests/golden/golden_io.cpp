// See golden_io.h. The files are written and read field by field in little-endian order, the layout that
// golden_exchange.py documents; every read says which field ran past the end of the file.
#include "golden_io.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <gtest/gtest.h>

extern char** environ;

namespace octet::testing {
namespace {

static_assert(std::endian::native == std::endian::little, "the golden files are little-endian");

constexpr char kInputMagic[8] = {'O', 'C', 'T', 'G', 'O', 'L', 'D', 'I'};
constexpr char kOutputMagic[8] = {'O', 'C', 'T', 'G', 'O', 'L', 'D', 'O'};
constexpr int32_t kVersion = 3;

// The architecture's number in the files.
int64_t architecture_code(ModelArchitecture arch) {
  switch (arch) {
    case ModelArchitecture::gpt2:
      return 0;
    case ModelArchitecture::llama:
      return 1;
  }
  throw std::runtime_error("an architecture the golden files do not know");
}

std::runtime_error system_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

int32_t to_int32(int64_t v, const char* what) {
  if (v < INT32_MIN || v > INT32_MAX) throw std::runtime_error(std::string(what) + " does not fit in int32");
  return static_cast<int32_t>(v);
}

class Writer {
 public:
  void bytes(const void* p, size_t n) { data_.append(static_cast<const char*>(p), n); }
  void i32(int64_t v, const char* what) {
    const int32_t x = to_int32(v, what);
    bytes(&x, sizeof x);
  }
  void f32(float v) { bytes(&v, sizeof v); }
  template <typename T>
  void array(const std::vector<T>& v) {
    bytes(v.data(), v.size() * sizeof(T));
  }
  void tensor(const TensorRecord& t) {
    i32(static_cast<int64_t>(t.name.size()), "name length");
    bytes(t.name.data(), t.name.size());
    i32(static_cast<int64_t>(t.shape.size()), "ndim");
    int64_t count = 1;
    for (const int64_t d : t.shape) {
      i32(d, "dimension");
      count *= d;
    }
    if (count != static_cast<int64_t>(t.values.size())) {
      throw std::runtime_error(t.name + ": shape holds " + std::to_string(count) + " values, have " +
                               std::to_string(t.values.size()));
    }
    array(t.values);
  }
  void save(const std::string& path) const {
    std::ofstream f(path, std::ios::binary);
    f.write(data_.data(), static_cast<std::streamsize>(data_.size()));
    if (!f) throw system_error("cannot write " + path);
  }

 private:
  std::string data_;
};

class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw system_error("cannot open " + path);
    data_.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  void bytes(void* p, size_t n, const char* what) {
    if (n > data_.size() - pos_) {
      throw std::runtime_error(path_ + ": ends at byte " + std::to_string(data_.size()) + " inside " + what);
    }
    std::memcpy(p, data_.data() + pos_, n);
    pos_ += n;
  }
  int64_t i32(const char* what) {
    int32_t x = 0;
    bytes(&x, sizeof x, what);
    return x;
  }
  float f32(const char* what) {
    float x = 0;
    bytes(&x, sizeof x, what);
    return x;
  }
  std::vector<float> floats(int64_t n, const char* what) {
    if (n < 0) throw std::runtime_error(path_ + ": negative count for " + what);
    std::vector<float> v(static_cast<size_t>(n));
    bytes(v.data(), v.size() * sizeof(float), what);
    return v;
  }
  TensorRecord tensor() {
    TensorRecord t;
    const int64_t name_length = i32("a tensor's name length");
    if (name_length < 0 || name_length > 256) throw std::runtime_error(path_ + ": implausible name length");
    t.name.resize(static_cast<size_t>(name_length));
    bytes(t.name.data(), t.name.size(), "a tensor's name");
    const int64_t ndim = i32("a tensor's ndim");
    if (ndim < 0 || ndim > 8) throw std::runtime_error(path_ + ": " + t.name + " has implausible ndim");
    int64_t count = 1;
    for (int64_t i = 0; i < ndim; ++i) {
      t.shape.push_back(i32("a tensor's shape"));
      count *= t.shape.back();
    }
    t.values = floats(count, t.name.c_str());
    return t;
  }
  void expect_end() const {
    if (pos_ != data_.size()) {
      throw std::runtime_error(path_ + ": " + std::to_string(data_.size() - pos_) + " bytes after the end");
    }
  }

 private:
  std::string path_;
  std::string data_;
  size_t pos_ = 0;
};

// Closes a posix_spawn file-actions object on every path out of run_program.
struct SpawnActions {
  posix_spawn_file_actions_t actions;
  SpawnActions() { posix_spawn_file_actions_init(&actions); }
  ~SpawnActions() { posix_spawn_file_actions_destroy(&actions); }
};

}  // namespace

void write_golden_input(const std::string& path, const GoldenInput& in) {
  const ModelConfig& c = in.config;
  if (c.rope_scaling.factor > 0.0f) throw std::runtime_error("the golden files carry no rotary scaling");
  Writer w;
  w.bytes(kInputMagic, sizeof kInputMagic);
  w.i32(kVersion, "version");
  w.i32(architecture_code(c.arch), "arch");
  w.i32(c.vocab_size, "V");
  w.i32(c.padded_vocab(), "Vp");
  w.i32(c.max_seq_len, "maxT");
  w.i32(c.layers, "L");
  w.i32(c.heads, "NH");
  w.i32(c.kv(), "KV");
  w.i32(c.channels, "C");
  w.i32(c.hidden(), "F");
  w.i32(c.tied_head() ? 1 : 0, "tied");
  w.i32(in.B, "B");
  w.i32(in.T, "T");
  w.i32(in.steps, "steps");
  w.i32(static_cast<int64_t>(in.parameters.size()), "parameter count");
  w.f32(in.learning_rate);
  w.f32(in.optimizer.beta1);
  w.f32(in.optimizer.beta2);
  w.f32(in.optimizer.eps);
  w.f32(in.optimizer.weight_decay);
  w.f32(c.rope_theta);
  w.i32(c.experts, "E");
  w.i32(c.experts_per_token, "k");
  w.i32(c.shared_expert ? 1 : 0, "shared expert");
  w.f32(c.router_aux_loss_coef);
  if (in.tokens.size() != static_cast<size_t>(in.B * in.T) || in.targets.size() != in.tokens.size()) {
    throw std::runtime_error("tokens and targets must hold B*T values each");
  }
  w.array(in.tokens);
  w.array(in.targets);
  for (const TensorRecord& t : in.parameters) w.tensor(t);
  w.save(path);
}

GoldenOutput read_golden_output(const std::string& path) {
  Reader r(path);
  char magic[8];
  r.bytes(magic, sizeof magic, "the magic");
  if (std::memcmp(magic, kOutputMagic, sizeof magic) != 0) {
    throw std::runtime_error(path + ": not a golden output file (bad magic)");
  }
  if (const int64_t version = r.i32("the version"); version != kVersion) {
    throw std::runtime_error(path + ": version " + std::to_string(version));
  }
  GoldenOutput out;
  out.N = r.i32("N");
  out.Vp = r.i32("Vp");
  const int64_t parameter_count = r.i32("the parameter count");
  const int64_t steps = r.i32("the step count");
  out.logits = r.floats(out.N * out.Vp, "the logits");
  out.logit_magnitude = r.floats(out.N * out.Vp, "the logit magnitudes");
  out.loss = r.f32("the loss");
  for (int64_t i = 0; i < parameter_count; ++i) out.gradients.push_back(r.tensor());
  out.step_losses = r.floats(steps, "the step losses");
  r.expect_end();
  return out;
}

std::string reference_script_path(const std::string& name) {
  const std::filesystem::path configured = std::filesystem::path(OCTET_GOLDEN_SCRIPT_DIR) / name;
  if (std::filesystem::exists(configured)) return configured.string();
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / configured.filename();
    if (std::filesystem::exists(beside)) return beside.string();
  }
  return configured.string();  // missing: running it reports the path
}

ProcessOutcome run_program(const std::vector<std::string>& argv) {
  std::string log_path = ::testing::TempDir() + "octet_golden_log_XXXXXX";
  const int fd = mkstemp(log_path.data());
  if (fd < 0) throw system_error("mkstemp " + log_path);
  close(fd);
  ProcessOutcome outcome;
  {
    SpawnActions fa;
    posix_spawn_file_actions_addopen(&fa.actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa.actions, 1, log_path.c_str(), O_WRONLY | O_TRUNC, 0);
    posix_spawn_file_actions_adddup2(&fa.actions, 1, 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, args[0], &fa.actions, nullptr, args.data(), environ);
    if (rc != 0) {
      outcome.output = "cannot start " + argv[0] + ": " + std::strerror(rc);
    } else {
      outcome.started = true;
      int status = 0;
      while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) throw system_error("waitpid");
      }
      if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
      std::ifstream f(log_path, std::ios::binary);
      outcome.output.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      if (WIFSIGNALED(status))
        outcome.output += "killed by signal " + std::to_string(WTERMSIG(status)) + "\n";
    }
  }
  std::remove(log_path.c_str());
  return outcome;
}

TempDirectory::TempDirectory() {
  std::string pattern = ::testing::TempDir() + "octet_golden_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw system_error("mkdtemp " + pattern);
  path_ = pattern;
}

TempDirectory::~TempDirectory() {
  std::error_code ec;  // a destructor never throws; a leftover temporary directory is harmless
  std::filesystem::remove_all(path_, ec);
}

}  // namespace octet::testing
