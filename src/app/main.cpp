// mpiformer [--help|--version] COMMAND [flags]
#include <sys/resource.h>
#include <unistd.h>

#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/blas_kernels.h"
#include "src/app/commands.h"
#include "src/app/inspect.h"
#include "src/app/options.h"
#include "src/core/error.h"
#include "src/core/file_limit.h"
#include "src/core/run_log.h"
#include "src/core/version.h"
#include "src/io/hdf5_file.h"
#include "src/parallel/communicator.h"

namespace {

using namespace mpiformer;

constexpr const char* kUsage =
    "Usage: mpiformer [--help|--version] COMMAND [flags]\n"
    "\n"
    "Commands:\n"
    "  train    train a Transformer (lm, seq2seq, mlm or classify), data-parallel over MPI ranks\n"
    "  bench    time training steps of a model shape; prints one JSON line\n"
    "  prepare  turn text (or a parallel pair) into HDF5 token shards for --data\n"
    "  eval     a checkpoint's loss, perplexity and accuracy on a shard set's valid or test split\n"
    "  generate translate (seq2seq) or continue (lm) text with a checkpoint\n"
    "  classify the best labels of text lines with a classifier checkpoint\n"
    "  average  average checkpoints' weights into one checkpoint (the last K of a run, or files)\n"
    "  inspect  summarise a shard, checkpoint or metrics file: mpiformer inspect FILE.h5\n"
    "\n"
    "`mpiformer COMMAND --help` lists a command's flags and their defaults.\n";

constexpr const char* kInspectUsage =
    "Usage: mpiformer inspect FILE.h5\n"
    "Prints a summary of a shard, checkpoint or metrics file; a file it cannot read\n"
    "or describe is one line naming it, exit 2.\n";

constexpr const char* kCommands =
    "train, eval, generate, classify, bench, prepare, average or inspect";

// Every rank parses the same arguments and fails the same way, so only rank 0
// speaks and every rank returns the same code without a collective.
int usage_failure(const Communicator& comm, const std::string& prefix, const std::string& what) {
  if (comm.is_root()) std::cerr << prefix << ": " << what << std::endl;
  return kExitUsage;
}

// A failure after the arguments were accepted: under MPI other ranks may be
// inside a collective, and only an abort ends them all.
int run_failure(Communicator& comm, const std::exception& e) {
  if (comm.size() > 1) comm.abort(e.what(), kExitFailure);
  say(stderr, "[rank 0] %s\n", e.what());
  return kExitFailure;
}

// Memory ran out: under a tight address-space limit (ulimit -v) any
// allocation can fail, the flags' parsing included. One line that names the
// limit, written without allocating, and every rank ends.
int memory_failure(Communicator& comm) {
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    std::fprintf(stderr,
                 "[rank %d] out of memory: the address-space limit (ulimit -v) of %" PRIu64
                 " MiB is used up; raise it\n",
                 comm.rank(), static_cast<uint64_t>(limit.rlim_cur) >> 20);
  } else {
    std::fprintf(stderr, "[rank %d] out of memory: an allocation failed\n", comm.rank());
  }
  if (comm.size() > 1) comm.abort(kExitFailure);
  return kExitFailure;
}

template <class Config>
int parse_and_run(Communicator& comm, const std::string& cmd, const std::vector<std::string>& args,
                  bool (*parse)(const std::vector<std::string>&, Config*, std::ostream&),
                  int (*run)(const Config&, Communicator&)) {
  Config cfg;
  std::ostringstream help;
  try {
    if (!parse(args, &cfg, help)) {
      if (comm.is_root()) std::cout << help.str() << std::flush;
      return 0;
    }
  } catch (const UsageError& e) {
    return usage_failure(comm, "mpiformer " + cmd, e.what());
  } catch (const std::bad_alloc&) {
    return memory_failure(comm);
  }
  try {
    return run(cfg, comm);
  } catch (const std::bad_alloc&) {
    return memory_failure(comm);
  } catch (const std::exception& e) {
    return run_failure(comm, e);
  }
}

int inspect(Communicator& comm, const std::vector<std::string>& args) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    if (comm.is_root()) std::cout << kInspectUsage;
    return 0;
  }
  if (args.size() != 1 || args[0].rfind("--", 0) == 0) {
    return usage_failure(comm, "mpiformer inspect",
                         "expected exactly one FILE.h5 (see mpiformer inspect --help)");
  }
  try {
    return run_inspect(args[0], comm);
  } catch (const std::bad_alloc&) {
    return memory_failure(comm);
  } catch (const std::exception& e) {
    return run_failure(comm, e);
  }
}

// Under srun every task must be a rank of one MPI world. A world smaller
// than SLURM_NTASKS means the MPI library did not reach srun's process
// manager (a --mpi plugin mismatch), and each task would train the same run
// on its own. mpirun inside an allocation checks its own world.
int check_srun_world(const Communicator& comm) {
  const char* ntasks = std::getenv("SLURM_NTASKS");
  const char* procid = std::getenv("SLURM_PROCID");
  if (!ntasks || !procid || !std::getenv("SLURM_STEP_NUM_TASKS") ||
      Communicator::started_by_mpirun()) {
    return 0;
  }
  const int expected = std::atoi(ntasks);
  if (expected <= 0 || expected == comm.size()) return 0;
  if (comm.is_root()) {
    std::cerr << "[task " << procid << "] mpiformer: srun started " << expected
              << " task(s) (SLURM_NTASKS) but MPI sees a world of " << comm.size()
              << " rank(s): the MPI library did not join srun's tasks; launch with srun "
                 "--mpi=pmix (srun --mpi=list shows the choices) or mpirun"
              << std::endl;
  }
  return kExitUsage;
}

// Before MPI starts every rank is alone: the rank its launcher gave it
// (mpirun, srun), so that a fault all ranks see is said once; 0 when none.
bool first_rank_of_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* rank = std::getenv(name);
    if (rank) return std::string(rank) == "0";
  }
  return true;
}

// Open files, before MPI, which would abort in many lines of its own
// without them: exit 2 after one line when too few may be open.
int check_file_limit() {
  const std::string fault = raise_file_limit();
  if (fault.empty()) return 0;
  if (first_rank_of_launcher()) std::cerr << "mpiformer: " << fault << std::endl;
  return kExitUsage;
}

// The commands that run the model (and so BLAS).
bool computes(const std::string& cmd) {
  return cmd == "train" || cmd == "eval" || cmd == "generate" || cmd == "classify" ||
         cmd == "bench";
}

// OpenBLAS maps a buffer per thread as it loads, and under an address-space
// limit (ulimit -v) that refuses one it retries for ever, before main. This
// runs first (the executable's .preinit_array precedes every library's
// initialisation): BLAS runs on one thread here anyway (make_cpu_ops), so
// OpenBLAS starts with one, and a limit that leaves no room for it and for
// MPI's start (threads, each with a stack and a malloc arena) is one line
// and exit 1, not a hang or a page of MPI's errors.
void bound_blas_start(int, char**, char**) {
  setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/0);
  rlimit limit{};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  // The libraries are mapped; OpenBLAS's buffer is 32 to 128 MiB, by build,
  // and MPI failed to start its threads with 270 MiB left, and to map a
  // component of its own (a line of its own on stderr) with 456 MiB left.
  constexpr uint64_t kStart = uint64_t{512} << 20;
  uint64_t pages = 0;
  if (FILE* statm = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(statm, "%" SCNu64, &pages) != 1) pages = 0;
    std::fclose(statm);
  }
  const uint64_t used = pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (limit.rlim_cur >= used + kStart) return;
  std::fprintf(stderr,
               "mpiformer: the address-space limit (ulimit -v) of %" PRIu64
               " MiB leaves too little once the libraries are loaded (they map %" PRIu64
               " MiB) for OpenBLAS and MPI to start: raise it above %" PRIu64 " MiB\n",
               static_cast<uint64_t>(limit.rlim_cur) >> 20, used >> 20, (used + kStart) >> 20);
  std::_Exit(kExitFailure);
}
__attribute__((section(".preinit_array"),
               used)) void (*const preinit_blas_start)(int, char**, char**) = bound_blas_start;

}  // namespace

int main(int argc, char** argv) {
  // A write past the file size limit (ulimit -f) then fails with EFBIG and is
  // reported like a full disk; by default the signal kills without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  if (const int code = check_file_limit()) return code;
  // OpenBLAS chose its kernels when it loaded; a better choice starts this
  // program again, which must happen before MPI starts (kernels/cpu/blas_kernels.h).
  if (argc > 1 && computes(argv[1])) {
    select_blas_kernels(argv, requested_blas_core(std::vector<std::string>(argv + 2, argv + argc)));
  }
  hdf5::initialize_library();  // before MPI (src/io/hdf5_file.h)
  Communicator comm(&argc, &argv);
  if (const int code = check_srun_world(comm)) return code;
  std::vector<std::string> args(argv + 1, argv + argc);

  if (args.empty()) {
    return usage_failure(comm, "mpiformer",
                         std::string("no command given; expected ") + kCommands + " (see --help)");
  }
  const std::string cmd = args.front();
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    if (comm.is_root()) std::cout << kUsage;
    return 0;
  }
  if (cmd == "--version") {
    if (comm.is_root()) {
      std::cout << "mpiformer " << MPIFORMER_VERSION << " (" << MPIFORMER_GIT_COMMIT << ")\n";
    }
    return 0;
  }
  if (cmd == "train")
    return parse_and_run<TrainConfig>(comm, cmd, rest, parse_train_options, run_train);
  if (cmd == "eval")
    return parse_and_run<EvalConfig>(comm, cmd, rest, parse_eval_options, run_eval);
  if (cmd == "generate")
    return parse_and_run<GenerateConfig>(comm, cmd, rest, parse_generate_options, run_generate);
  if (cmd == "classify")
    return parse_and_run<ClassifyConfig>(comm, cmd, rest, parse_classify_options, run_classify);
  if (cmd == "bench")
    return parse_and_run<BenchConfig>(comm, cmd, rest, parse_bench_options, run_bench);
  if (cmd == "prepare")
    return parse_and_run<PrepareConfig>(comm, cmd, rest, parse_prepare_options, run_prepare);
  if (cmd == "average")
    return parse_and_run<AverageConfig>(comm, cmd, rest, parse_average_options, run_average);
  if (cmd == "inspect") return inspect(comm, rest);
  return usage_failure(comm, "mpiformer",
                       "unknown command '" + cmd + "'; expected " + kCommands + " (see --help)");
}
