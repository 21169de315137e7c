// Result<T> for the setup and control path: a value or an Error with a code
// (fl_status), a message that says what was wrong and what to do, and context
// added on the way up.  The data path does not use this: a frame's failure is the
// fl_status in its completion, with no message to allocate.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

#include "framelink/framelink.h"

namespace framelink {

struct Error {
  int code = FL_ERR_RESOURCES;  // an fl_status
  std::string message;

  // Prefix context, e.g. err.context("attach client 7").
  Error& context(const std::string& what) {
    message = what + ": " + message;
    return *this;
  }
};

inline Error makeError(int code, std::string message) { return Error{code, std::move(message)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT(google-explicit-constructor): by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor): by design

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

  const Error& error() const& {
    assert(!ok());
    return std::get<1>(v_);
  }
  Error&& error() && {
    assert(!ok());
    return std::get<1>(std::move(v_));
  }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT(google-explicit-constructor)

  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const Error& error() const& {
    assert(!ok_);
    return error_;
  }
  Error&& error() && {
    assert(!ok_);
    return std::move(error_);
  }

 private:
  Error error_;
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace framelink
