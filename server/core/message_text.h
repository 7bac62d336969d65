// Text that goes into status messages: what a client sent (model names, tensor names, parameter
// keys, request ids, paths), and whole messages as they leave at the protocol edge.
//
// A client's string can be megabytes long and hold any bytes. Echoed as it is, it makes a gRPC
// status too large for its trailing metadata (the client sees RESOURCE_EXHAUSTED "received
// metadata size exceeds hard limit" instead of the real answer) and an HTTP error body that is not
// valid JSON. Both functions return valid UTF-8 of bounded size, and leave the usual text (short,
// printable, valid UTF-8) exactly as it is, so that messages clients match on keep their words.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace sluice {

// How many bytes of a client's string an error message shows.
inline constexpr size_t kQuotedClientTextBytes = 128;
// The longest status message sent to a client (gRPC's metadata limit is 8 KiB by default, and
// the status message travels in it).
inline constexpr size_t kStatusMessageBytes = 4096;
// The smallest bound either function keeps to (a smaller `max_bytes` counts as this): room for the
// cut marker and a little text.
inline constexpr size_t kMinMessageTextBytes = 32;

// `text`, a string a client sent, rendered for an error message. The caller adds its own quotes.
//  - Characters that could hide or rewrite the message (or a log line) are shown as escapes:
//    C0 controls and DEL as \xNN (a newline is \x0A), C1 controls, the bidirectional overrides
//    and isolates (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069) and the line and paragraph
//    separators (U+2028/9) as \uNNNN; every byte that is not part of valid UTF-8 (RFC 3629: no
//    overlong forms, surrogates or code points past U+10FFFF) as \xNN. A backslash stays itself:
//    the rendering is for reading, not for decoding back.
//  - The result is at most `max_bytes` bytes (at least kMinMessageTextBytes). When the rendering
//    is longer, whole characters (or escapes) are kept from the start, as many as fit with the
//    marker "...(N bytes)" after them, N being the size of `text` in bytes. A rendering of
//    exactly `max_bytes` bytes is kept whole.
// The result is always valid UTF-8. Reads about `max_bytes` bytes of `text` at most, whatever its
// size. Thread-safe (no state).
std::string QuoteClientText(absl::string_view text, size_t max_bytes = kQuotedClientTextBytes);

// `message`, a whole status message, bounded for the protocol edge (ToGrpcStatus, the HTTP error
// body). Valid UTF-8 is kept as it is, controls included (the transports escape them); each byte
// that is not part of valid UTF-8 becomes \xNN. Cut like QuoteClientText, to at most `max_bytes`
// bytes (at least kMinMessageTextBytes) with the same marker. The result is always valid UTF-8.
std::string CapMessage(absl::string_view message, size_t max_bytes = kStatusMessageBytes);

}  // namespace sluice
