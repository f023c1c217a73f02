#ifndef C_UPLOAD_SQLITE_SHIM_H
#define C_UPLOAD_SQLITE_SHIM_H
#include <sqlite3.h>

// SQLITE_TRANSIENT is a cast macro Swift cannot import: SQLite copies the bytes before these return.
static inline int upload_sqlite_bind_text(sqlite3_stmt *statement, int index, const char *text, int bytes) {
    return sqlite3_bind_text(statement, index, text, bytes, SQLITE_TRANSIENT);
}

static inline int upload_sqlite_bind_blob(sqlite3_stmt *statement, int index, const void *bytes, int count) {
    return sqlite3_bind_blob(statement, index, bytes, count, SQLITE_TRANSIENT);
}
#endif
