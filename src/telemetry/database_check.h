// What a reader of telemetry.sqlite (octet inspect, octet report) accepts: the seven tables every octet
// database has and, where present, the four later versions added (shadow_loss, shadow, recalibrations,
// localization), with their columns, each value of the type and range octet writes, and no more rows or text
// than a reader can hold. A database that breaks a rule is refused with one line naming the file, the table,
// the column or key, the row and what was expected. Internal to the library.
#pragma once

#include <cstdint>
#include <string_view>

#include "sqlite_db.h"

namespace octet::telemetry_db {

// Steps, as the store counts them, above this are not read (a run of a trillion steps is not a real one).
inline constexpr int64_t kMaxStep = 1'000'000'000'000;
// Distinct layer names a reader accepts (GPT-2 1.5B has 193 linear layers).
inline constexpr int64_t kMaxLayers = 2048;

// Throws invalid_input unless the database holds what octet writes (docs/telemetry.md). Call it inside the
// read transaction that the reader's queries use, before they run: it bounds every table's rows and text, so
// that what the reader then allocates is bounded too.
void check_telemetry_database(Database& db);

// Whether the database has `table` (a reader of an optional table takes it as empty where it has not).
bool table_present(Database& db, std::string_view table);

}  // namespace octet::telemetry_db
