// `mpiformer prepare --kind image`: an .npz or HDF5 file of images and their
// integer labels to image shards. Small enough for rank 0 alone; the other
// ranks only agree on the outcome.
#pragma once

#include "src/core/config.h"
#include "src/parallel/communicator.h"

namespace mpiformer::prepare {

int run_prepare_images(const PrepareConfig& cfg, Communicator& comm);

}  // namespace mpiformer::prepare
