// Ranks as processes, on one machine or several, joined over TCP: the group every multi-process run starts
// with. Rank 0 listens on the launcher's master port (launch.h), the other ranks connect to it, and each
// shows a fingerprint (the octet binary and the configuration it runs); a rank whose fingerprint differs from
// rank 0's is refused, on every rank, with one message naming it, before anything is trained.
//
// It is also a Communicator over host memory, every collective passing through rank 0, which folds the ranks'
// values in rank order with the arithmetic InProcessGroup uses (rank_order.h): CPU ranks as processes give the
// bits of CPU ranks as threads. That is for the CPU backend and for small control values; GPUs exchange
// their tensors over NCCL (nccl_group.h), which bootstraps through this group.
//
// Faults: a rank that ends, or fails and calls abort(), makes every other rank's next collective throw within
// moments, naming that rank; a rank that sends nothing for the timeout makes them throw naming it too. No
// rank waits forever.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "octet/dist/communicator.h"
#include "octet/dist/launch.h"

namespace octet::dist {

// What every rank must agree on: named parts ("octet binary", "configuration"), each a digest.
struct Fingerprint {
  std::vector<std::pair<std::string, std::string>> parts;
};

// How long a rank waits for another (to connect, or to arrive at a collective) before it gives up: the
// OCTET_DIST_TIMEOUT environment variable in seconds when set, else 600.
std::chrono::milliseconds rank_timeout();

class SocketGroup final : public Communicator {
 public:
  // Joins the run of `env`. Throws invalid_input when a rank's fingerprint differs from rank 0's or the ranks
  // disagree on the world's size, and training_failed when a rank does not come within `timeout`.
  SocketGroup(const RankEnvironment& env, const Fingerprint& mine, std::chrono::milliseconds timeout);
  ~SocketGroup() override;
  SocketGroup(const SocketGroup&) = delete;
  SocketGroup& operator=(const SocketGroup&) = delete;

  int rank() const override;
  int size() const override;
  void all_reduce_sum(std::span<float> values) override;
  void all_reduce_sum(std::span<double> values) override;
  void all_reduce_sum_bf16(std::span<uint16_t> values) override;
  void all_reduce_max(std::span<float> values) override;
  void reduce_scatter_sum(std::span<const float> send, std::span<float> receive) override;
  void reduce_scatter_sum_in_place(std::span<float> values, int64_t offset, int64_t total) override;
  void reduce_scatter_sum_in_place_bf16(std::span<uint16_t> values, int64_t offset, int64_t total) override;
  void all_gather(std::span<const float> send, std::span<float> receive) override;
  void all_gather(std::span<const std::byte> send, std::span<std::byte> receive) override;
  void broadcast(std::span<std::byte> data, int root) override;
  void barrier() override;

  // This rank stops: every other rank's collective in progress or next throws, naming this rank and
  // `reason`. The group cannot be used afterwards.
  void abort(const std::string& reason);

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace octet::dist
