// A transport whose all-reduces run on a stream of their own on the device
// (NCCL on a GPU), ordered by events, so neither the host nor the compute
// stream waits for a bucket:
//
//   start(slot)  an event recorded on the compute stream behind every op
//                queued so far (the bucket's last gradient kernel, and with
//                the exact sum its fixed-point kernel); the communication
//                stream waits on it, runs the all-reduce and records the
//                slot's done event;
//   test(slot)   whether that done event has passed (a query, no wait);
//                while it has not, whether the collective failed since (a
//                peer that died leaves the event pending forever), which
//                throws;
//   join()       the compute stream waits on every done event, so the
//                optimizer runs after the sums.
//
// The streams and the collective are interfaces: CUDA + NCCL in
// src/parallel/nccl_transport.cpp, and a fake in the tests that checks the
// order of these calls on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/parallel/transport.h"

namespace mpiformer {

// The device's two streams and one pair of events per slot.
class StreamQueue {
 public:
  virtual ~StreamQueue() = default;
  // The communication stream waits for everything queued so far on the
  // compute stream (an event recorded there now).
  virtual void comm_waits_for_compute(int slot) = 0;
  // Records slot's done event on the communication stream.
  virtual void record_done(int slot) = 0;
  // Whether slot's done event has passed.
  virtual bool done(int slot) = 0;
  // The compute stream waits for slot's done event.
  virtual void compute_waits_for(int slot) = 0;
};

// An in-place SUM over every rank, queued on the communication stream.
class StreamCollective {
 public:
  virtual ~StreamCollective() = default;
  virtual void all_reduce(float* x, size_t n) = 0;    // x: device (n)
  virtual void all_reduce(int64_t* x, size_t n) = 0;  // x: device (n)
  // A sharded optimizer's collectives (ReduceTransport::start_reduce_to_owners,
  // start_all_gather): the SUM of x over ranks in place on `root` only, and
  // root's x to every rank; several queued between group_start() and
  // group_end() run as one (NCCL's groups).  x: device (n)
  virtual void reduce(float* x, size_t n, int root) {
    (void)x, (void)n, (void)root;
    throw std::logic_error("this stream collective has no reduce");
  }
  virtual void reduce(int64_t* x, size_t n, int root) {
    (void)x, (void)n, (void)root;
    throw std::logic_error("this stream collective has no reduce");
  }
  virtual void broadcast(float* x, size_t n, int root) {
    (void)x, (void)n, (void)root;
    throw std::logic_error("this stream collective has no broadcast");
  }
  virtual void group_start() {}
  virtual void group_end() {}
  // What went wrong with the collectives queued so far after they were
  // queued (a peer died, the network failed), or "" while nothing has. A
  // query, no wait.
  virtual std::string async_error() = 0;
};

class StreamTransport : public ReduceTransport {
 public:
  StreamTransport(std::string name, std::unique_ptr<StreamQueue> queue,
                  std::unique_ptr<StreamCollective> collective);
  std::string name() const override { return name_; }
  bool takes_device_memory() const override { return true; }
  void start(int slot, float* x, size_t n) override;
  void start(int slot, int64_t* x, size_t n) override;
  void start_reduce_to_owners(int slot, float* x, size_t offset, size_t n,
                              const std::vector<size_t>& bounds) override;
  void start_reduce_to_owners(int slot, int64_t* x, size_t offset, size_t n,
                              const std::vector<size_t>& bounds) override;
  void start_all_gather(int slot, float* x, const std::vector<size_t>& bounds) override;
  bool test(int slot) override;
  void join() override;

 private:
  template <typename T>
  void start_typed(int slot, T* x, size_t n);
  template <typename T>
  void reduce_to_owners(int slot, T* x, size_t offset, size_t n, const std::vector<size_t>& bounds);
  // Checks the slot is free and puts the communication stream behind the
  // compute stream's work so far.
  void open_slot(int slot);

  std::string name_;
  std::unique_ptr<StreamQueue> queue_;
  std::unique_ptr<StreamCollective> collective_;
  std::vector<int> in_flight_;  // slots started since the last join
};

}  // namespace mpiformer
