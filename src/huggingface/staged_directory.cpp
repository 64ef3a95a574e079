// A directory written under a temporary name and renamed into place (see staged_directory.h).
#include "staged_directory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "octet/check.h"
#include "octet/io/atomic_file.h"

namespace octet::hf {

namespace fs = std::filesystem;

StagedDirectory::StagedDirectory(fs::path final_dir, bool replace)
    : final_dir_(std::move(final_dir)), replace_(replace) {
  OCTET_REQUIRE(!final_dir_.empty(), "--out is empty: name the directory to write");
  // "out/" names the directory out: drop the trailing separator so that the parent and the name are right.
  if (!final_dir_.has_filename()) final_dir_ = final_dir_.parent_path();
  final_dir_ = fs::absolute(final_dir_);
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(final_dir_, ec);
  if (status.type() == fs::file_type::not_found) return;
  OCTET_REQUIRE(!ec, "{} cannot be used: {}", final_dir_.string(), ec.message());
  OCTET_REQUIRE(status.type() == fs::file_type::directory,
                "{} exists and is not a directory; choose another --out", final_dir_.string());
  const bool empty = fs::is_empty(final_dir_, ec);
  OCTET_REQUIRE(!ec, "{} cannot be read: {}", final_dir_.string(), ec.message());
  OCTET_REQUIRE(empty || replace_,
                "{} exists and is not empty; give --force to replace it, or choose another --out",
                final_dir_.string());
}

StagedDirectory::~StagedDirectory() {
  if (committed_ || temporary_.empty()) return;
  std::error_code ec;
  fs::remove_all(temporary_, ec);
}

const fs::path& StagedDirectory::create() {
  if (!temporary_.empty()) return temporary_;
  std::error_code ec;
  const fs::path parent = final_dir_.parent_path();
  fs::create_directories(parent, ec);
  OCTET_REQUIRE(!ec, "cannot create {}: {}", parent.string(), ec.message());
  const fs::path temporary =
      parent / (".octet-tmp-" + std::to_string(::getpid()) + "-" + final_dir_.filename().string());
  fs::remove_all(temporary, ec);  // a leftover of an interrupted run of this process id
  fs::create_directory(temporary, ec);
  OCTET_REQUIRE(!ec, "cannot create {}: {}", temporary.string(), ec.message());
  temporary_ = temporary;
  return temporary_;
}

void StagedDirectory::commit() {
  OCTET_CHECK(!temporary_.empty() && !committed_, "a created, uncommitted directory for {}",
              final_dir_.string());
  io::fsync_directory(temporary_);
  std::error_code ec;
  const fs::path parent = final_dir_.parent_path();
  if (fs::exists(final_dir_, ec)) {
    // Empty, or replaced under --force: moved aside so that the rename below cannot fail on a full directory.
    const fs::path old =
        parent / (".octet-old-" + std::to_string(::getpid()) + "-" + final_dir_.filename().string());
    fs::remove_all(old, ec);
    fs::rename(final_dir_, old, ec);
    OCTET_REQUIRE(!ec, "cannot move the previous {} aside: {}", final_dir_.string(), ec.message());
    fs::rename(temporary_, final_dir_, ec);
    OCTET_REQUIRE(!ec, "cannot move {} into place: {}", final_dir_.string(), ec.message());
    fs::remove_all(old, ec);
  } else {
    fs::rename(temporary_, final_dir_, ec);
    OCTET_REQUIRE(!ec, "cannot move {} into place: {}", final_dir_.string(), ec.message());
  }
  committed_ = true;
  io::fsync_directory(parent);
}

}  // namespace octet::hf
