// Where a process stands in a run of several: its rank, the number of ranks, its rank on its machine, and how
// the ranks find each other, read from the environment that the launcher set. octet reads the variables of
// the launchers users have:
//   octet train --gpus N   OCTET_RANK, OCTET_WORLD_SIZE, OCTET_LOCAL_RANK (set for the processes it starts)
//   mpirun (Open MPI)      OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   srun (Slurm)           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//   torchrun               RANK, WORLD_SIZE, LOCAL_RANK
// and the first of these sets that is present decides. Rank 0's address and port come from
// OCTET_MASTER_ADDR / OCTET_MASTER_PORT, or MASTER_ADDR / MASTER_PORT as torchrun's users set them; the port
// defaults to 29517 and the address to 127.0.0.1 (one machine).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace octet::dist {

struct RankEnvironment {
  int rank = 0;
  int world = 1;
  int local_rank = 0;     // the rank among those on this machine: which of its GPUs this rank takes
  std::string launcher;   // "octet train --gpus/--ranks", "mpirun", "srun" or "torchrun"
  std::string master_address = "127.0.0.1";
  int master_port = 29517;
};

// The environment's description of this process's rank, or nothing when no launcher's variables are set (a
// run of one). `get` reads a variable (std::getenv by default; tests pass their own). Throws invalid_input
// naming the variable when one is present but malformed or out of range (a rank not below the world size).
using EnvironmentReader = std::function<std::optional<std::string>(std::string_view name)>;
std::optional<RankEnvironment> rank_environment(const EnvironmentReader& get);
std::optional<RankEnvironment> rank_environment();

}  // namespace octet::dist
