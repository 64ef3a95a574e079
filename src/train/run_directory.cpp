// The run directory's checks, octet's own files of a run and the one-writer lock (see run_directory.h).
#include "octet/train/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "octet/check.h"
#include "octet/train/checkpoint.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

// octet's own entries of a run directory and what each holds, for the messages.
struct RunEntry {
  const char* name;
  bool directory;
  const char* holds;
};
constexpr RunEntry kRunEntries[] = {
    {"config.toml", false, "the resolved configuration"},
    {"precision_map.json", false, "the precision map"},
    {"metrics.jsonl", false, "the per-step metrics"},
    {"telemetry.sqlite", false, "the telemetry database"},
    {"telemetry.sqlite-wal", false, "the telemetry database's log"},
    {"telemetry.sqlite-shm", false, "the telemetry database's log index"},
    {"telemetry.sqlite-journal", false, "the telemetry database's journal"},
    {"checkpoints", true, "the checkpoints"},
    {kRunLockFile, false, "the lock of the run directory"},
};

// The type of `p`, symbolic links followed: not_found when it does not exist; a loop of symbolic links or a
// path that cannot be examined is refused, naming `role`.
fs::file_type type_of(const fs::path& p, std::string_view role) {
  std::error_code ec;
  const fs::file_status s = fs::status(p, ec);
  if (s.type() == fs::file_type::not_found) return s.type();
  OCTET_REQUIRE(!ec, "{} {} cannot be used: {}", role, p.string(), ec.message());
  return s.type();
}

// Whether `p` exists in any form, a dangling or looping symbolic link included.
bool present(const fs::path& p) {
  std::error_code ec;
  return fs::symlink_status(p, ec).type() != fs::file_type::not_found && !ec;
}

void require_writable_directory(const fs::path& dir, const fs::path& run_dir) {
  const bool writable = ::access(dir.c_str(), W_OK | X_OK) == 0;
  const int error = errno;
  if (dir == run_dir) {
    OCTET_REQUIRE(writable, "logging.run_dir {} is not writable: {}; choose another logging.run_dir",
                  run_dir.string(), std::strerror(error));
  } else {
    OCTET_REQUIRE(writable,
                  "logging.run_dir {} cannot be created: {} is not writable: {}; choose another "
                  "logging.run_dir",
                  run_dir.string(), dir.string(), std::strerror(error));
  }
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

// Whether `path` lies in `dir` (both resolved as far as they exist).
bool lies_in(const fs::path& path, const fs::path& dir) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  const fs::path d = fs::weakly_canonical(fs::absolute(dir), ec);
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty()) continue;  // a trailing separator
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
}

}  // namespace

RunStart plan_run_start(const fs::path& run_dir, bool resume, const fs::path& resume_from, bool overwrite) {
  OCTET_REQUIRE(!(resume && overwrite),
                "--resume continues the run that --overwrite would remove: give one of them");
  OCTET_REQUIRE(!(resume && !resume_from.empty()),
                "--resume and --resume-from both name where to continue from: give one of them");
  RunStart start;
  start.present = run_files_present(run_dir);
  const std::string present = fmt::format("{}", fmt::join(start.present, ", "));
  if (resume) {
    start.checkpoint = checkpoint_to_continue(run_dir);
    OCTET_REQUIRE(start.checkpoint.has_value(), "--resume: no complete checkpoint in {}",
                  (run_dir / "checkpoints").string());
    start.continues_run_directory = true;
    return start;
  }
  if (!resume_from.empty()) {
    const fs::path& from = resume_from;
    std::error_code ec;
    OCTET_REQUIRE(fs::is_regular_file(from / "state.json", ec),
                  "--resume-from {} is not a checkpoint (a directory with state.json)", from.string());
    const std::optional<fs::path> latest = latest_checkpoint(run_dir);
    if (latest && fs::equivalent(*latest, from, ec) && !overwrite) {
      start.checkpoint = latest;  // the same as --resume
      start.continues_run_directory = true;
      return start;
    }
    start.checkpoint = from;
    if (start.present.empty()) return start;
    OCTET_REQUIRE(overwrite,
                  "logging.run_dir {} holds a run already ({}) and --resume-from {} is not its latest "
                  "checkpoint: use --overwrite "
                  "to remove that run first, or choose another logging.run_dir",
                  run_dir.string(), present, from.string());
    OCTET_REQUIRE(
        !lies_in(from, run_dir),
        "--overwrite would remove {}, which --resume-from continues from: copy it elsewhere first, or "
        "choose another logging.run_dir",
        from.string());
    start.remove_present = true;
    return start;
  }
  if (!start.present.empty()) {
    OCTET_REQUIRE(overwrite,
                  "logging.run_dir {} holds a run already ({}): use --resume to continue it, --overwrite to "
                  "start afresh (removes "
                  "octet's files of that run), or choose another logging.run_dir",
                  run_dir.string(), present);
    start.remove_present = true;
  }
  return start;
}

std::vector<std::string> run_files_present(const fs::path& run_dir) {
  std::vector<std::string> names;
  for (const RunEntry& e : kRunEntries) {
    if (std::string_view(e.name) == kRunLockFile || !present(run_dir / e.name)) continue;
    if (e.directory) {
      std::error_code ec;
      const bool empty = fs::is_directory(run_dir / e.name, ec) && fs::is_empty(run_dir / e.name, ec) && !ec;
      if (empty) continue;
      names.push_back(std::string(e.name) + "/");
    } else {
      names.emplace_back(e.name);
    }
  }
  return names;
}

void check_run_directory(const fs::path& run_dir) {
  OCTET_REQUIRE(!run_dir.empty(), "logging.run_dir is empty: set it to the directory the run writes to");
  const fs::file_type type = type_of(run_dir, "logging.run_dir");
  if (type == fs::file_type::not_found) {
    // The nearest existing ancestor must be a directory the run can create its directory in.
    std::error_code ec;
    fs::path ancestor = fs::absolute(run_dir, ec);
    OCTET_REQUIRE(!ec, "logging.run_dir {} cannot be used: {}", run_dir.string(), ec.message());
    for (;;) {
      ancestor = ancestor.parent_path();
      const fs::file_type t = type_of(ancestor, "logging.run_dir's ancestor");
      if (t == fs::file_type::not_found && ancestor != ancestor.root_path()) continue;
      OCTET_REQUIRE(t == fs::file_type::directory,
                    "logging.run_dir {} cannot be created: {} is not a directory; choose another "
                    "logging.run_dir",
                    run_dir.string(), ancestor.string());
      require_writable_directory(ancestor, run_dir);
      return;
    }
  }
  OCTET_REQUIRE(type == fs::file_type::directory,
                "logging.run_dir {} is not a directory; choose another logging.run_dir", run_dir.string());
  require_writable_directory(run_dir, run_dir);
  for (const RunEntry& e : kRunEntries) {
    const fs::path p = run_dir / e.name;
    const fs::file_type t = type_of(p, "the run directory's");
    if (t == fs::file_type::not_found) {
      OCTET_REQUIRE(!present(p), "{} is a dangling symbolic link where octet keeps {}; remove it", p.string(),
                    e.holds);
      continue;
    }
    const bool right = e.directory ? t == fs::file_type::directory : t == fs::file_type::regular;
    OCTET_REQUIRE(right,
                  "{} is {} where octet keeps {} (a {}); move it away or choose another logging.run_dir",
                  p.string(), t == fs::file_type::directory ? "a directory" : "not a regular file", e.holds,
                  e.directory ? "directory" : "file");
    OCTET_REQUIRE(::access(p.c_str(), e.directory ? W_OK | X_OK : W_OK) == 0, "{} is not writable: {}",
                  p.string(), std::strerror(errno));
  }
}

std::vector<std::string> remove_run_files(const fs::path& run_dir) {
  std::vector<std::string> removed = run_files_present(run_dir);
  for (const std::string& name : removed) {
    std::error_code ec;
    fs::remove_all(run_dir / name, ec);
    OCTET_REQUIRE(!ec, "--overwrite: cannot remove {}: {}", (run_dir / name).string(), ec.message());
  }
  return removed;
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

void RunDirectoryLock::take(const fs::path& path, int fd) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
    fd_ = fd;
    return;
  }
  const int error = errno;
  std::string owner(256, '\0');
  const ssize_t n = ::pread(fd, owner.data(), owner.size(), 0);
  owner.resize(n > 0 ? static_cast<size_t>(n) : 0);
  ::close(fd);
  OCTET_REQUIRE(error == EWOULDBLOCK, "cannot lock {}: {}", path.string(), std::strerror(error));
  while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
  for (char& c : owner) {
    if (c == '\n') c = ' ';
  }
  OCTET_REQUIRE(false,
                "{} is in use by another octet run ({}; lock {}): one run directory has one writer; wait for "
                "it to end, or choose another logging.run_dir",
                path.parent_path().string(), owner.empty() ? "owner not known yet" : owner, path.string());
}

void RunDirectoryLock::lock_existing(const fs::path& run_dir) {
  if (fd_ >= 0) return;
  const fs::path path = run_dir / kRunLockFile;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    OCTET_REQUIRE(errno == ENOENT, "cannot open {}: {}", path.string(), std::strerror(errno));
    return;
  }
  take(path, fd);
}

void RunDirectoryLock::acquire(const fs::path& run_dir) {
  const fs::path path = run_dir / kRunLockFile;
  if (fd_ < 0) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    OCTET_REQUIRE(fd >= 0, "cannot create {}: {}", path.string(), std::strerror(errno));
    take(path, fd);
  }
  // A lock taken through lock_existing's read-only descriptor is kept; the owner is written through a second
  // descriptor of the same file.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  OCTET_REQUIRE(fd >= 0, "cannot write {}: {}", path.string(), std::strerror(errno));
  const std::string owner = fmt::format("pid {} on host {}\n", ::getpid(), host_name());
  const bool written = ::ftruncate(fd, 0) == 0 &&
                       ::pwrite(fd, owner.data(), owner.size(), 0) == static_cast<ssize_t>(owner.size());
  const int error = errno;
  ::close(fd);
  OCTET_REQUIRE(written, "cannot write {}: {}", path.string(), std::strerror(error));
}

}  // namespace octet
