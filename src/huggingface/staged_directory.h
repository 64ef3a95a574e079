// A directory written in full under a temporary name beside its final place and renamed into place at the
// end, so that readers see it complete or not at all; the import and the export write their output so.
#pragma once

#include <filesystem>

namespace octet::hf {

class StagedDirectory {
 public:
  // Checks the final place without writing anything: a path that exists must be a directory, and an empty
  // one unless `replace`. Throws invalid_input naming the path otherwise.
  StagedDirectory(std::filesystem::path final_dir, bool replace);
  // Removes the temporary directory unless commit() ran; never throws.
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  // Creates the parent directories and the temporary directory (the first write); returns its path.
  const std::filesystem::path& create();
  // Flushes the temporary directory and renames it into place (moving a replaced directory aside first and
  // removing it afterwards).
  void commit();

 private:
  std::filesystem::path final_dir_;
  std::filesystem::path temporary_;
  bool replace_;
  bool committed_ = false;
};

}  // namespace octet::hf
