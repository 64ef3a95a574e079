// Ranks as processes over TCP (see socket_group.h). Rank 0 is the hub: every other rank holds one connection,
// to rank 0. A collective is one frame from each rank to rank 0, in rank order, and one frame back to each;
// rank 0 checks that every rank called the same collective with the same sizes, folds the values in rank
// order (rank_order.h) and sends the results. A frame is a fixed header and its payload; a rank that fails
// sends an abort frame instead, which rank 0 passes on to everyone.
#include "octet/dist/socket_group.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "octet/check.h"
#include "rank_order.h"

namespace octet::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x3854434F;  // "OCT8"

enum class FrameKind : uint32_t { hello = 1, welcome = 2, refuse = 3, data = 4, abort = 5 };

struct Header {
  uint32_t magic = kMagic;
  FrameKind kind = FrameKind::data;
  uint32_t op = 0;     // CollectiveOp, for data frames
  int32_t root = 0;    // a broadcast's root; for a hello, the sender's rank
  uint64_t count = 0;  // the collective's element count; for a hello, the sender's world size
  uint64_t bytes = 0;  // the payload's size
};

// A peer that closed, went silent or aborted, with the message every rank should see.
struct PeerFailure {
  std::string message;
};

double seconds(std::chrono::milliseconds t) {
  return std::chrono::duration<double>(t).count();
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Waits until fd is ready for `events` or the deadline passes; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return true;  // the read or write that follows reports the error
  }
}

// Sends every byte, or says why not ("closed" or the error).
std::optional<std::string> send_all(int fd, const void* data, size_t size, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    if (!wait_for(fd, POLLOUT, deadline)) return std::string("timed out");
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return std::string(n == 0 ? "closed" : std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return std::nullopt;
}

enum class ReceiveResult { ok, closed, timed_out };

ReceiveResult receive_all(int fd, void* data, size_t size, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    if (!wait_for(fd, POLLIN, deadline)) return ReceiveResult::timed_out;
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return ReceiveResult::closed;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return ReceiveResult::ok;
}

std::string serialize(const Fingerprint& f) {
  std::string text;
  for (const auto& [name, value] : f.parts) text += name + "=" + value + "\n";
  return text;
}

std::map<std::string, std::string> parse(const std::string& text) {
  std::map<std::string, std::string> parts;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) parts[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return parts;
}

}  // namespace

std::chrono::milliseconds rank_timeout() {
  const char* value = std::getenv("OCTET_DIST_TIMEOUT");
  if (value == nullptr) return std::chrono::seconds(600);
  char* end = nullptr;
  const double seconds = std::strtod(value, &end);
  OCTET_REQUIRE(*value != '\0' && end != nullptr && *end == '\0' && seconds > 0 && seconds <= 7 * 86400,
                "OCTET_DIST_TIMEOUT={:?}: expected seconds, more than 0 and at most a week", value);
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

struct SocketGroup::State {
  int rank = 0;
  int world = 1;
  std::chrono::milliseconds timeout{0};
  // Rank 0: the connection of each other rank (index = rank; -1 for itself). Others: [0], to rank 0.
  std::vector<int> peers;
  bool broken = false;

  ~State() {
    for (const int fd : peers) {
      if (fd >= 0) ::close(fd);
    }
  }

  Clock::time_point deadline() const { return Clock::now() + timeout; }

  void send_frame(int to, Header h, std::span<const std::byte> payload) {
    h.bytes = payload.size();
    const int fd = peers[static_cast<size_t>(to)];
    const Clock::time_point until = deadline();
    std::optional<std::string> failed = send_all(fd, &h, sizeof h, until);
    if (!failed && !payload.empty()) failed = send_all(fd, payload.data(), payload.size(), until);
    if (!failed) return;
    // Rank 0 may have told this rank why before it closed: its abort frame says more than the broken pipe.
    if (rank != 0) receive_frame(0, "a send to rank 0", Clock::now() + std::chrono::seconds(2));
    throw PeerFailure{fmt::format("rank {} could not be reached ({}): it ended or its machine is gone",
                                  rank == 0 ? to : 0, *failed)};
  }

  // The next frame from `from` (a rank; rank 0's index is 0 on the other ranks), its payload into a fresh
  // buffer. An abort frame becomes a PeerFailure carrying its message.
  std::pair<Header, std::vector<std::byte>> receive_frame(int from, const char* during) {
    return receive_frame(from, during, deadline());
  }
  std::pair<Header, std::vector<std::byte>> receive_frame(int from, const char* during, Clock::time_point until) {
    const int fd = peers[static_cast<size_t>(rank == 0 ? from : 0)];
    Header h;
    ReceiveResult r = receive_all(fd, &h, sizeof h, until);
    std::vector<std::byte> payload;
    if (r == ReceiveResult::ok) {
      OCTET_CHECK(h.magic == kMagic && h.bytes < (uint64_t{1} << 40), "a frame from rank {}", from);
      payload.resize(h.bytes);
      r = receive_all(fd, payload.data(), payload.size(), until);
    }
    if (r == ReceiveResult::closed) {
      throw PeerFailure{fmt::format("rank {} closed its connection during {}: it ended or died", from, during)};
    }
    if (r == ReceiveResult::timed_out) {
      throw PeerFailure{fmt::format(
          "rank {} sent nothing for {} s during {}: it hangs or its machine is gone (OCTET_DIST_TIMEOUT sets "
          "how long ranks wait)",
          from, seconds(timeout), during)};
    }
    if (h.kind == FrameKind::abort) {
      throw PeerFailure{std::string(reinterpret_cast<const char*>(payload.data()), payload.size())};
    }
    return {h, std::move(payload)};
  }

  // Rank 0: tells every other rank (but `except`) that the run stops, best effort.
  void abort_others(const std::string& message, int except) {
    Header h;
    h.kind = FrameKind::abort;
    for (int r = 1; r < world; ++r) {
      if (r == except || peers[static_cast<size_t>(r)] < 0) continue;
      h.bytes = message.size();
      const Clock::time_point until = Clock::now() + std::chrono::seconds(5);
      if (!send_all(peers[static_cast<size_t>(r)], &h, sizeof h, until))
        send_all(peers[static_cast<size_t>(r)], message.data(), message.size(), until);
    }
  }

  // Runs one collective; a peer's failure becomes this rank's Error, after rank 0 has passed it on.
  template <typename Body>
  void collective(CollectiveOp op, Body body) {
    OCTET_REQUIRE(!broken, "{} on rank {}: the group of ranks has stopped", collective_name(op), rank);
    try {
      body();
    } catch (const PeerFailure& f) {
      broken = true;
      if (rank == 0) abort_others(f.message, -1);
      throw Error(ErrorKind::training_failed, f.message);
    }
  }

  // Rank 0: rank `from`'s frame of the collective (op, count, root), whose payload must be `bytes` long.
  std::vector<std::byte> take(int from, CollectiveOp op, uint64_t count, int root, size_t bytes) {
    auto [h, payload] = receive_frame(from, collective_name(op));
    if (h.kind != FrameKind::data || h.op != static_cast<uint32_t>(op) || h.count != count || h.root != root ||
        payload.size() != bytes) {
      throw PeerFailure{fmt::format(
          "the ranks disagree on a collective: rank 0 called {} with {} values (root {}), rank {} called {} "
          "with {} values (root {})",
          collective_name(op), count, root, from,
          h.op <= static_cast<uint32_t>(CollectiveOp::reduce_scatter_sum_in_place_bf16)
              ? collective_name(static_cast<CollectiveOp>(h.op))
              : "something else",
          h.count, h.root)};
    }
    return std::move(payload);
  }

  // Another rank: sends its part of the collective to rank 0 and receives its result, `bytes` long.
  std::vector<std::byte> exchange(CollectiveOp op, uint64_t count, int root, std::span<const std::byte> mine,
                                  size_t bytes) {
    Header h;
    h.op = static_cast<uint32_t>(op);
    h.count = count;
    h.root = root;
    send_frame(0, h, mine);
    auto [reply, payload] = receive_frame(0, collective_name(op));
    OCTET_CHECK(reply.kind == FrameKind::data && payload.size() == bytes,
                "rank 0's result of {}: {} bytes, expected {}", collective_name(op), payload.size(), bytes);
    return std::move(payload);
  }

  void give(int to, CollectiveOp op, uint64_t count, int root, std::span<const std::byte> result) {
    Header h;
    h.op = static_cast<uint32_t>(op);
    h.count = count;
    h.root = root;
    send_frame(to, h, result);
  }

  // values = fold over the ranks' values in rank order, on every rank.
  template <typename T, typename Fold>
  void reduce(CollectiveOp op, std::span<T> values, Fold fold) {
    if (world == 1) return;
    collective(op, [&] {
      const std::span<const std::byte> bytes = std::as_bytes(values);
      if (rank != 0) {
        const std::vector<std::byte> result = exchange(op, values.size(), 0, bytes, bytes.size());
        std::memcpy(values.data(), result.data(), result.size());
        return;
      }
      for (int r = 1; r < world; ++r) {
        const std::vector<std::byte> theirs = take(r, op, values.size(), 0, bytes.size());
        fold(values.data(), reinterpret_cast<const T*>(theirs.data()), values.size());
      }
      for (int r = 1; r < world; ++r) give(r, op, values.size(), 0, std::as_bytes(values));
    });
  }

  // Each rank's part of `values` (shard_part) = the fold over the ranks' values of that part, in rank
  // order, sent to that rank alone; the rest of `values` is left as it is. Every rank sends rank 0 its
  // whole run with the run's offset and total after it, which rank 0 checks are its own.
  template <typename T, typename Fold>
  void to_owners(CollectiveOp op, std::span<T> values, int64_t offset, int64_t total, Fold fold) {
    const auto n = static_cast<int64_t>(values.size());
    if (world == 1) {
      shard_part(offset, n, total, 0, 1);  // checks the run
      return;
    }
    collective(op, [&] {
      const int64_t where[2] = {offset, total};
      const size_t bytes = values.size_bytes() + sizeof where;
      const auto part_bytes = [&](const ShardPart& p) {
        return std::as_bytes(values.subspan(static_cast<size_t>(p.begin), static_cast<size_t>(p.size())));
      };
      if (rank != 0) {
        std::vector<std::byte> mine(bytes);
        std::memcpy(mine.data(), values.data(), values.size_bytes());
        std::memcpy(mine.data() + values.size_bytes(), where, sizeof where);
        const ShardPart part = shard_part(offset, n, total, rank, world);
        const std::vector<std::byte> result = exchange(op, values.size(), 0, mine, part_bytes(part).size());
        if (!result.empty()) std::memcpy(values.data() + part.begin, result.data(), result.size());
        return;
      }
      std::vector<T> sums(values.begin(), values.end());
      for (int r = 1; r < world; ++r) {
        const std::vector<std::byte> theirs = take(r, op, values.size(), 0, bytes);
        int64_t their_where[2];
        std::memcpy(their_where, theirs.data() + values.size_bytes(), sizeof their_where);
        if (their_where[0] != offset || their_where[1] != total) {
          throw PeerFailure{
              fmt::format("the ranks disagree on a collective: rank 0 called {} over [{}, {}) of {}, rank {} "
                          "over [{}, {}) of {}",
                          collective_name(op), offset, offset + n, total, r, their_where[0],
                          their_where[0] + n, their_where[1])};
        }
        fold(sums.data(), reinterpret_cast<const T*>(theirs.data()), sums.size());
      }
      for (int r = 1; r < world; ++r) {
        const ShardPart part = shard_part(offset, n, total, r, world);
        give(r, op, values.size(), 0,
             std::as_bytes(std::span<const T>(sums).subspan(static_cast<size_t>(part.begin),
                                                            static_cast<size_t>(part.size()))));
      }
      const ShardPart mine = shard_part(offset, n, total, 0, world);
      std::copy(sums.begin() + mine.begin, sums.begin() + mine.end, values.begin() + mine.begin);
    });
  }
};

SocketGroup::SocketGroup(const RankEnvironment& env, const Fingerprint& mine, std::chrono::milliseconds timeout)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.rank = env.rank;
  s.world = env.world;
  s.timeout = timeout;
  OCTET_REQUIRE(env.world >= 1 && env.rank >= 0 && env.rank < env.world, "rank {} of {} ranks", env.rank,
                env.world);
  if (env.world == 1) return;
  const Clock::time_point until = s.deadline();
  const std::string fingerprint = serialize(mine);
  if (env.rank == 0) {
    s.peers.assign(static_cast<size_t>(env.world), -1);
    const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    OCTET_REQUIRE(listener >= 0, "rank 0 cannot open a socket: {}", std::strerror(errno));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{listener};
    const int one = 1;
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(env.master_port));
    OCTET_REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                      ::listen(listener, env.world) == 0,
                  "rank 0 cannot listen on port {}: {}; set OCTET_MASTER_PORT (or MASTER_PORT) to a free port",
                  env.master_port, std::strerror(errno));
    std::map<int, std::map<std::string, std::string>> shown;
    while (static_cast<int>(shown.size()) < env.world - 1) {
      if (!wait_for(listener, POLLIN, until)) {
        std::vector<int> missing;
        for (int r = 1; r < env.world; ++r) {
          if (!shown.contains(r)) missing.push_back(r);
        }
        throw Error(ErrorKind::training_failed,
                    fmt::format("rank(s) {} did not join rank 0 on port {} within {} s: were they started, with "
                                "the same master address and port? (OCTET_DIST_TIMEOUT sets how long ranks wait)",
                                fmt::join(missing, ", "), env.master_port, seconds(timeout)));
      }
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Header h;
      std::string text;
      bool ok = receive_all(fd, &h, sizeof h, until) == ReceiveResult::ok && h.magic == kMagic &&
                h.kind == FrameKind::hello && h.bytes < (1u << 20);
      if (ok) {
        text.resize(h.bytes);
        ok = receive_all(fd, text.data(), text.size(), until) == ReceiveResult::ok;
      }
      // Something that is not a rank of this run (a stray connection): ignored.
      if (!ok || h.root < 1 || h.root >= env.world || s.peers[static_cast<size_t>(h.root)] >= 0 ||
          h.count != static_cast<uint64_t>(env.world)) {
        if (ok && h.count != static_cast<uint64_t>(env.world)) {
          const std::string why = fmt::format("a rank of {} ranks joined rank 0 of {}: every rank must be "
                                              "started with the same number of ranks",
                                              h.count, env.world);
          Header refuse;
          refuse.kind = FrameKind::refuse;
          refuse.bytes = why.size();
          send_all(fd, &refuse, sizeof refuse, until);
          send_all(fd, why.data(), why.size(), until);
          ::close(fd);
          s.abort_others(why, -1);
          throw Error(ErrorKind::invalid_input, why);
        }
        ::close(fd);
        continue;
      }
      s.peers[static_cast<size_t>(h.root)] = fd;
      shown[h.root] = parse(text);
    }
    // Every rank has shown its fingerprint: the first that differs from rank 0's is refused, on every rank.
    const std::map<std::string, std::string> ours = parse(fingerprint);
    std::string refusal;
    for (const auto& [r, theirs] : shown) {
      for (const auto& [name, value] : ours) {
        const auto it = theirs.find(name);
        const std::string seen = it == theirs.end() ? "none" : it->second;
        if (seen == value || !refusal.empty()) continue;
        refusal = fmt::format("rank {}'s {} differs from rank 0's ({} on rank {}, {} on rank 0): every rank "
                              "must run the same octet with the same configuration",
                              r, name, seen, r, value);
      }
    }
    Header reply;
    reply.kind = refusal.empty() ? FrameKind::welcome : FrameKind::refuse;
    for (int r = 1; r < env.world; ++r) {
      reply.bytes = refusal.size();
      send_all(s.peers[static_cast<size_t>(r)], &reply, sizeof reply, until);
      if (!refusal.empty()) send_all(s.peers[static_cast<size_t>(r)], refusal.data(), refusal.size(), until);
    }
    OCTET_REQUIRE(refusal.empty(), "{}", refusal);
    return;
  }

  // Another rank: connects to rank 0 (which may not listen yet), shows its fingerprint, waits for the answer.
  s.peers.assign(1, -1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int looked_up = ::getaddrinfo(env.master_address.c_str(), std::to_string(env.master_port).c_str(),
                                      &hints, &found);
  OCTET_REQUIRE(looked_up == 0 && found != nullptr, "rank {}: the master address {:?} is not known: {}",
                env.rank, env.master_address, ::gai_strerror(looked_up));
  sockaddr_storage target{};
  const socklen_t target_size = found->ai_addrlen;
  std::memcpy(&target, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    OCTET_REQUIRE(fd >= 0, "rank {} cannot open a socket: {}", env.rank, std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&target), target_size) == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      s.peers[0] = fd;
      break;
    }
    ::close(fd);
    if (Clock::now() >= until) {
      throw Error(ErrorKind::training_failed,
                  fmt::format("rank {} could not reach rank 0 at {}:{} within {} s: is rank 0 running, and is "
                              "the master address one this machine can reach?",
                              env.rank, env.master_address, env.master_port, seconds(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Header hello;
  hello.kind = FrameKind::hello;
  hello.root = env.rank;
  hello.count = static_cast<uint64_t>(env.world);
  hello.bytes = fingerprint.size();
  const bool sent = !send_all(s.peers[0], &hello, sizeof hello, until) &&
                    !send_all(s.peers[0], fingerprint.data(), fingerprint.size(), until);
  Header answer;
  std::string text;
  bool answered = sent && receive_all(s.peers[0], &answer, sizeof answer, until) == ReceiveResult::ok &&
                  answer.magic == kMagic && answer.bytes < (1u << 20);
  if (answered) {
    text.resize(answer.bytes);
    answered = receive_all(s.peers[0], text.data(), text.size(), until) == ReceiveResult::ok;
  }
  if (!answered) {
    throw Error(ErrorKind::training_failed,
                fmt::format("rank {} reached rank 0 at {}:{} but had no answer: rank 0 stopped, or the port "
                            "belongs to something else",
                            env.rank, env.master_address, env.master_port));
  }
  if (answer.kind == FrameKind::refuse) throw Error(ErrorKind::invalid_input, text);
  if (answer.kind == FrameKind::abort) throw Error(ErrorKind::training_failed, text);
  OCTET_CHECK(answer.kind == FrameKind::welcome, "rank 0's answer to rank {}'s hello", env.rank);
}

SocketGroup::~SocketGroup() = default;

int SocketGroup::rank() const {
  return state_->rank;
}

int SocketGroup::size() const {
  return state_->world;
}

void SocketGroup::all_reduce_sum(std::span<float> values) {
  state_->reduce(CollectiveOp::all_reduce_sum_f32, values, rank_order::add<float>);
}

void SocketGroup::all_reduce_sum(std::span<double> values) {
  state_->reduce(CollectiveOp::all_reduce_sum_f64, values, rank_order::add<double>);
}

void SocketGroup::all_reduce_sum_bf16(std::span<uint16_t> values) {
  state_->reduce(CollectiveOp::all_reduce_sum_bf16, values, rank_order::add_bf16);
}

void SocketGroup::all_reduce_max(std::span<float> values) {
  state_->reduce(CollectiveOp::all_reduce_max_f32, values, rank_order::max);
}

void SocketGroup::reduce_scatter_sum(std::span<const float> send, std::span<float> receive) {
  State& s = *state_;
  const size_t chunk = receive.size();
  OCTET_CHECK(send.size() == chunk * static_cast<size_t>(s.world),
              "reduce_scatter_sum: {} values sent for {} ranks of {}", send.size(), s.world, chunk);
  const CollectiveOp op = CollectiveOp::reduce_scatter_sum_f32;
  if (s.world == 1) {
    std::copy(send.begin(), send.end(), receive.begin());
    return;
  }
  s.collective(op, [&] {
    if (s.rank != 0) {
      const std::vector<std::byte> mine =
          s.exchange(op, send.size(), 0, std::as_bytes(send), chunk * sizeof(float));
      std::memcpy(receive.data(), mine.data(), mine.size());
      return;
    }
    std::vector<float> sums(send.begin(), send.end());
    for (int r = 1; r < s.world; ++r) {
      const std::vector<std::byte> theirs = s.take(r, op, send.size(), 0, send.size_bytes());
      rank_order::add(sums.data(), reinterpret_cast<const float*>(theirs.data()), sums.size());
    }
    for (int r = 1; r < s.world; ++r) {
      s.give(r, op, send.size(), 0,
             std::as_bytes(std::span<const float>(sums.data() + chunk * static_cast<size_t>(r), chunk)));
    }
    std::copy_n(sums.begin(), chunk, receive.begin());
  });
}

void SocketGroup::reduce_scatter_sum_in_place(std::span<float> values, int64_t offset, int64_t total) {
  state_->to_owners(CollectiveOp::reduce_scatter_sum_in_place_f32, values, offset, total,
                    rank_order::add<float>);
}

void SocketGroup::reduce_scatter_sum_in_place_bf16(std::span<uint16_t> values, int64_t offset,
                                                   int64_t total) {
  state_->to_owners(CollectiveOp::reduce_scatter_sum_in_place_bf16, values, offset, total,
                    rank_order::add_bf16);
}

void SocketGroup::all_gather(std::span<const float> send, std::span<float> receive) {
  all_gather(std::as_bytes(send), std::as_writable_bytes(receive));
}

void SocketGroup::all_gather(std::span<const std::byte> send, std::span<std::byte> receive) {
  State& s = *state_;
  OCTET_CHECK(receive.size() == send.size() * static_cast<size_t>(s.world),
              "all_gather: {} bytes from each of {} ranks into {}", send.size(), s.world, receive.size());
  const CollectiveOp op = CollectiveOp::all_gather_bytes;
  // `send` may be this rank's chunk of `receive`: copied first.
  const std::vector<std::byte> mine(send.begin(), send.end());
  if (s.world == 1) {
    std::copy(mine.begin(), mine.end(), receive.begin());
    return;
  }
  s.collective(op, [&] {
    if (s.rank != 0) {
      const std::vector<std::byte> all = s.exchange(op, send.size(), 0, mine, receive.size());
      std::copy(all.begin(), all.end(), receive.begin());
      return;
    }
    std::copy(mine.begin(), mine.end(), receive.begin());
    for (int r = 1; r < s.world; ++r) {
      const std::vector<std::byte> theirs = s.take(r, op, send.size(), 0, send.size());
      std::copy(theirs.begin(), theirs.end(), receive.begin() + static_cast<ptrdiff_t>(send.size()) * r);
    }
    for (int r = 1; r < s.world; ++r) s.give(r, op, send.size(), 0, receive);
  });
}

void SocketGroup::broadcast(std::span<std::byte> data, int root) {
  State& s = *state_;
  OCTET_CHECK(root >= 0 && root < s.world, "broadcast from rank {} of {}", root, s.world);
  const CollectiveOp op = CollectiveOp::broadcast;
  if (s.world == 1) return;
  s.collective(op, [&] {
    if (s.rank != 0) {
      const std::span<const std::byte> mine = s.rank == root ? std::span<const std::byte>(data)
                                                             : std::span<const std::byte>();
      const std::vector<std::byte> result = s.exchange(op, data.size(), root, mine, data.size());
      std::copy(result.begin(), result.end(), data.begin());
      return;
    }
    for (int r = 1; r < s.world; ++r) {
      const std::vector<std::byte> theirs = s.take(r, op, data.size(), root, r == root ? data.size() : 0);
      if (r == root) std::copy(theirs.begin(), theirs.end(), data.begin());
    }
    for (int r = 1; r < s.world; ++r) s.give(r, op, data.size(), root, data);
  });
}

void SocketGroup::barrier() {
  State& s = *state_;
  if (s.world == 1) return;
  const CollectiveOp op = CollectiveOp::barrier;
  s.collective(op, [&] {
    if (s.rank != 0) {
      s.exchange(op, 0, 0, {}, 0);
      return;
    }
    for (int r = 1; r < s.world; ++r) s.take(r, op, 0, 0, 0);
    for (int r = 1; r < s.world; ++r) s.give(r, op, 0, 0, {});
  });
}

void SocketGroup::abort(const std::string& reason) {
  State& s = *state_;
  if (s.broken || s.world == 1) return;
  s.broken = true;
  const std::string message = fmt::format("rank {} stopped: {}", s.rank, reason);
  if (s.rank == 0) {
    s.abort_others(message, -1);
    return;
  }
  Header h;
  h.kind = FrameKind::abort;
  h.bytes = message.size();
  const Clock::time_point until = Clock::now() + std::chrono::seconds(5);
  if (!send_all(s.peers[0], &h, sizeof h, until)) send_all(s.peers[0], message.data(), message.size(), until);
}

}  // namespace octet::dist
