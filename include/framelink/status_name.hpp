// status_name.hpp: the name of an fl_status code, header-only over
// fl_status_str.  Apart from framelink.hpp so that framelinkd, which has a
// framelink::Error of its own, can use it too.
#ifndef FRAMELINK_STATUS_NAME_HPP
#define FRAMELINK_STATUS_NAME_HPP

#include <string>

#include "framelink/framelink.h"

namespace framelink {

// "FL_ERR_TOO_LARGE" (fl_status_str without its description), for logs,
// metric labels and JSON keys; FL_STATUS_<n> for a code this libframelink
// does not know (a newer daemon's), so that the name is still one token.
inline std::string statusName(int status) {
  const std::string text = fl_status_str(status);
  if (text.rfind("FL_", 0) != 0) return "FL_STATUS_" + std::to_string(status);
  return text.substr(0, text.find(':'));
}

}  // namespace framelink

#endif  // FRAMELINK_STATUS_NAME_HPP
