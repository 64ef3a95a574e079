// The run directory's safety, as `octet train` needs it before it writes there: what octet's files of a run
// are, whether the directory already holds a run, checks that the directory can be written (so that a bad
// logging.run_dir is one clear refusal, not a failure halfway through), and the lock that makes a run
// directory one writer's: RUN_DIR/octet.lock, held with flock(2) so that a killed owner leaves no stale lock.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace octet {

inline constexpr const char* kRunLockFile = "octet.lock";

// The names (relative to the run directory) of octet's own files of a run that are present: config.toml,
// precision_map.json, metrics.jsonl, telemetry.sqlite and its -wal, -shm and -journal files, and checkpoints/
// when it holds anything. The lock file is left out: it alone is no run.
std::vector<std::string> run_files_present(const std::filesystem::path& run_dir);

// Checks, without writing anything, that `run_dir` can serve as a run directory: set, no symbolic-link loop,
// a directory (or creatable as one: its nearest existing ancestor is a writable directory), writable, and
// octet's files in it of the right kind (metrics.jsonl a file, checkpoints/ a directory, ...). Throws
// octet::Error (invalid_input) with one line naming the path and what is wrong.
void check_run_directory(const std::filesystem::path& run_dir);

// Removes octet's own files of a previous run (those run_files_present names); other files stay. Returns the
// names removed. Throws octet::Error (invalid_input) naming the file when one cannot be removed.
std::vector<std::string> remove_run_files(const std::filesystem::path& run_dir);

// How a run starts in its run directory, decided before anything is written.
struct RunStart {
  std::optional<std::filesystem::path> checkpoint;  // the checkpoint it continues from
  bool continues_run_directory = false;  // the checkpoint is the run directory's latest: its records go on
  std::vector<std::string> present;      // octet's files of a run found in the run directory
  bool remove_present = false;           // --overwrite: they are removed before the run writes
};

// Decides, without writing anything, how `octet train` starts in `run_dir`: afresh (refused when the
// directory holds a run, unless `overwrite`), from its latest complete checkpoint (`resume`), or from the
// checkpoint directory `resume_from` (non-empty; of any run; the same as `resume` when it is the run
// directory's latest checkpoint; otherwise the run directory must hold no run, or `overwrite` removes it,
// provided the checkpoint does not lie in it). Throws octet::Error (invalid_input) with one line saying
// what is wrong and the ways out.
RunStart plan_run_start(const std::filesystem::path& run_dir, bool resume,
                        const std::filesystem::path& resume_from, bool overwrite);

// RUN_DIR/octet.lock, locked with flock(2) for as long as this object lives; the file holds the owner's pid
// and host. The lock goes with the process, so a killed owner never blocks the next run; the file stays.
class RunDirectoryLock {
 public:
  RunDirectoryLock() = default;
  ~RunDirectoryLock();
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

  // Locks an existing lock file without changing it (nothing is created when there is none). Throws
  // octet::Error (invalid_input) naming the owner's pid and host when another process holds the lock.
  void lock_existing(const std::filesystem::path& run_dir);
  // Locks RUN_DIR/octet.lock, creating it when needed (the run directory must exist), unless held already,
  // and writes this process's pid and host into it. Throws as lock_existing does.
  void acquire(const std::filesystem::path& run_dir);
  bool held() const { return fd_ >= 0; }

 private:
  void take(const std::filesystem::path& path, int fd);

  int fd_ = -1;
};

}  // namespace octet
