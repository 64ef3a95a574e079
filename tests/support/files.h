// File-system fixtures shared by the tests of readers and of the run directory: a snapshot of a directory
// (to show that a refused command wrote nothing), and a FIFO whose writer comes late (to show that a reader
// refuses it at once instead of blocking in open).
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

namespace octet::testing {

// Every entry under `dir`, recursively, by its path relative to `dir`: its type, size, modification time (ns)
// and a hash of its contents. Equal snapshots mean nothing was created, removed, written or touched.
std::map<std::string, std::string> directory_snapshot(const std::filesystem::path& dir);

// Makes a FIFO at `path` and, after `delay`, opens it for writing once, which wakes a reader blocked in open:
// a reader that blocks then fails a timing check rather than hanging the test. The destructor waits for the
// writer and removes the FIFO.
class FifoWithLateWriter {
 public:
  explicit FifoWithLateWriter(std::filesystem::path path, std::chrono::seconds delay = std::chrono::seconds(3));
  ~FifoWithLateWriter();
  FifoWithLateWriter(const FifoWithLateWriter&) = delete;
  FifoWithLateWriter& operator=(const FifoWithLateWriter&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::thread writer_;
};

}  // namespace octet::testing
