// The `octet` command-line tool: builds the command tree, parses the arguments and turns every failure into
// one line on standard error and an exit code: 0 success, 1 internal error or failed output, 2 invalid
// arguments or input, 3 training could not go on, 128 + the signal for a training run that SIGINT or SIGTERM
// stopped. CLI11's own printing and exit codes are bypassed so that every usage error looks the same and
// exits with 2.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cmd_bench.h"
#include "cmd_calibrate.h"
#include "cmd_fp8.h"
#include "cmd_hf.h"
#include "cmd_inspect.h"
#include "cmd_localize.h"
#include "cmd_report.h"
#include "cmd_train.h"
#include "crash_report.h"
#include "io.h"
#include "octet/check.h"
#include "octet/version.h"
#ifdef OCTET_HAVE_CUDA
#include "octet/backend/cuda_registration.h"
#endif

namespace {

// "octet fp8 quantize": the chosen command, as far as parsing got.
std::string command_path(const CLI::App& root) {
  std::string path = root.get_name();
  const CLI::App* app = &root;
  for (;;) {
    const std::vector<const CLI::App*> chosen = app->get_subcommands([](const CLI::App*) { return true; });
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : chosen) {
      if (sub->parsed()) next = sub;
    }
    if (next == nullptr) return path;
    path += " " + next->get_name();
    app = next;
  }
}

// Messages become one line: CLI11 and exception texts may contain newlines.
std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '.')) text.pop_back();
  return text;
}

void print_error(const std::string& command, const char* what, const std::string& message) {
  std::fputs(fmt::format("{}: {}: {}\n", command, what, one_line(message)).c_str(), stderr);
}

int run_command_line(int argc, char** argv) {
  CLI::App app("octet: FP8 mixed-precision training engine, command-line tool", "octet");
  app.set_version_flag("--version", fmt::format("octet {}", octet::kVersion), "Print the version and exit");
  app.require_subcommand(0, 1);  // none: print help and fail; two: a usage error
  app.footer(
      "Exit codes: 0 success, 1 internal error or output that could not be written, 2 invalid arguments\n"
      "or input (one line on standard error says what and where; nothing is printed on standard output),\n"
      "3 training could not go on, 130 or 143 (128 + the signal) a training run stopped by SIGINT or "
      "SIGTERM\n"
      "after saving its checkpoint.\n"
      "\n"
      "Examples:\n"
      "  octet train configs/quickstart.toml\n"
      "  octet config show configs/quickstart.toml --set train.mixed_precision=bf16\n"
      "  octet inspect runs/quickstart --layer h.0.mlp.c_fc\n"
      "  octet report runs/quickstart --compare runs/quickstart-bf16\n"
      "  octet bench train configs/bench/gpt2-124M.toml\n"
      "  octet calibrate configs/quickstart.toml --batches 16\n"
      "  octet localize configs/quickstart.toml --batches 4\n"
      "  octet import hf ~/models/Llama-3.2-1B --out imported/llama-1b\n"
      "  octet export runs/quickstart --format hf --out exported/quickstart\n"
      "  octet fp8 table --format e5m2\n"
      "  echo \"0.5 300 1e-4\" | octet fp8 quantize --format e4m3 --scale 2\n"
      "  octet fp8 quantize --help");
  octet::cli::Fp8Command fp8(app);
  octet::cli::WorkflowCommands workflow(app);
  octet::cli::ReportCommand report(app);
  octet::cli::InspectCommand inspect(app);
  octet::cli::BenchCommands bench(app);
  octet::cli::HuggingFaceCommands huggingface(app);
  octet::cli::CalibrateCommand calibrate(app);
  octet::cli::LocalizeCommand localize(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);  // help() shows the deepest chosen subcommand
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::fputs(fmt::format("{}\n", e.what()).c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    const std::string command = command_path(app);
    print_error(command, "error", fmt::format("{}; run '{} --help' for usage", one_line(e.what()), command));
    return 2;
  }

  const std::string command = command_path(app);
  if (!fp8.leaf_selected() && !report.selected() && !inspect.selected() && !bench.leaf_selected() &&
      !calibrate.selected() && !localize.selected() &&
      (!workflow.selected() || workflow.group_without_command()) &&
      (!huggingface.selected() || huggingface.group_without_command())) {
    // `octet` or `octet fp8` alone: a usage error whose most useful message is the list of commands.
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  try {
    if (workflow.selected()) return workflow.run();
    if (report.selected()) return report.run();
    if (inspect.selected()) return inspect.run();
    if (bench.leaf_selected()) return bench.run();
    if (huggingface.selected()) return huggingface.run();
    if (calibrate.selected()) return calibrate.run();
    if (localize.selected()) return localize.run();
    fp8.run(stdin, stdout, stderr);
    return 0;
  } catch (const octet::Error& e) {
    print_error(command, e.kind() == octet::ErrorKind::internal ? "internal error" : "error", e.what());
    return e.exit_code();
  } catch (const octet::cli::IoError& e) {
    print_error(command, "error", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave that cannot be used (a symbolic-link loop, a file where a directory should be):
    // the reason and the path, without the library's wording around them.
    print_error(command, "error",
                fmt::format("{}{}{}", e.path1().string(), e.path1().empty() ? "" : ": ", e.code().message()));
    return 2;
  } catch (const std::bad_alloc&) {
    print_error(command, "error", "not enough memory for what the arguments or the configuration ask for");
    return 2;
  } catch (const std::length_error&) {
    print_error(command, "error", "the arguments or the configuration ask for a size too large to allocate");
    return 2;
  } catch (const std::exception& e) {
    print_error(command, "internal error", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The command line for a crash report, joined once before anything can fail.
  static std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i > 0 ? " " : "") + std::string(argv[i]);
  octet::cli::install_crash_report(command_line.c_str());
  // Anything that escapes the command itself (building the command tree, formatting a message) is still
  // reported in one line rather than through std::terminate.
  try {
#ifdef OCTET_HAVE_CUDA
    octet::register_cuda_backend();  // the engine finds "cuda" in the backend registry
#endif
    return run_command_line(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "octet: internal error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fputs("octet: internal error: unknown exception\n", stderr);
    return 1;
  }
}
