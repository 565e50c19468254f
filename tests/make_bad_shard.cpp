// make_bad_shard KIND FAULT OUT.h5: writes one test shard with the named
// fault, for the end-to-end tests of `inspect` and `train --data`.
// make_bad_shard --corrupt-chunk DATASET FILE.h5: flips a byte inside the
// first chunk of DATASET of an existing shard, so its header still reads but
// its data fails the checksum (a fault only the rank that loads it sees).
#include <exception>
#include <iostream>
#include <string>

#include "tests/bad_shards.h"

int main(int argc, char** argv) {
  namespace ts = mpiformer::test_shards;
  if (argc != 4) {
    std::cerr << "usage: make_bad_shard lm|seq2seq FAULT OUT.h5\n"
                 "       make_bad_shard --corrupt-chunk DATASET FILE.h5\nfaults:";
    for (const ts::FaultName& f : ts::fault_names()) std::cerr << ' ' << f.name;
    std::cerr << '\n';
    return 2;
  }
  try {
    if (std::string(argv[1]) == "--corrupt-chunk")
      ts::corrupt_first_chunk(argv[3], argv[2]);
    else
      ts::write_bad_shard(argv[3], argv[1], ts::parse_fault(argv[2]));
  } catch (const std::exception& e) {
    std::cerr << "make_bad_shard: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
