// Opening the files mpiformer writes, in a run directory that others may
// share: never through a symbolic link (another user could point it at any
// file the run may write), never blocking on a FIFO, and only a regular file.
#pragma once

#include <string>

namespace mpiformer {

// Opens `path` to write it in place; `flags` are open(2)'s (O_WRONLY or
// O_RDWR, with O_CREAT, O_APPEND, ...). Returns the descriptor, or -1 with
// *why set to what follows "PATH: " in a message ("is a symbolic link, ...").
int open_regular_file(const std::string& path, int flags, std::string* why);

// Creates `path` anew for writing (O_WRONLY): whatever stood at the name,
// a link included, is removed first, and the name must then be new
// (O_EXCL), so a link planted in between is not followed either. Returns
// the descriptor, or -1 with *why as open_regular_file.
int create_new_file(const std::string& path, std::string* why);

}  // namespace mpiformer
