// Starting this program again, as itself (kernels/cpu/blas_kernels.h needs
// a new start for OpenBLAS to load other kernels).
//
// The kernel names a process after the last component of the path it was
// executed from, cut to 15 characters: /proc/PID/comm, which ps, top,
// pgrep, pkill and a cluster's process accounting show. Executing
// /proc/self/exe would name every rank "exe"; the running binary's resolved
// path keeps "mpiformer", and argv keeps argv[0] as the user typed it.
#pragma once

#include <string>

namespace mpiformer {

// The running binary's path as the kernel resolved it when the program
// started (/proc/self/exe's target): "/opt/mpiformer/bin/mpiformer", with
// " (deleted)" after it once the file is gone. "" when unreadable.
std::string running_binary_path();

// The name the kernel gives a process executed from `path` (or from the
// binary `path` once was, " (deleted)" dropped): its last component, cut to
// the 15 characters /proc/PID/comm holds.
std::string process_name_of(const std::string& path);

// What to execute to start again: `path` when that file still is the
// running binary (same device and inode), else /proc/self/exe, which always
// is, so that a binary rebuilt or removed since the first start never runs
// in its place.
std::string restart_target(const std::string& path, bool still_the_running_binary);

// Executes the running binary again with argv (argv[0] kept), from the
// path restart_target() chooses. Returns only when that failed, with errno
// set.
void restart_program(char** argv);

// In the new start: when it had to go through /proc/self/exe, names the
// process after its binary again. Called before any thread starts.
void keep_process_name();

}  // namespace mpiformer
