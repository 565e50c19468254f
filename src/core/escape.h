// Text from a file (an attribute, a config value, a label name) printed on a
// terminal or in a one-line message: the file decides its bytes, and an
// escape sequence or a line break in them would reach the terminal or forge
// a line of ours. One helper, used wherever such text is printed.
#pragma once

#include <string>
#include <string_view>

namespace mpiformer {

// `text` with every control character (C0, DEL and the C1 range U+0080 to
// U+009F) and every byte that is not part of valid UTF-8 written as \xNN,
// a newline as \n; printable UTF-8 (any language) is kept as it is.
std::string escaped(std::string_view text);

}  // namespace mpiformer
