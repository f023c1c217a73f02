#ifndef C_UPLOAD_SYSTEM_H
#define C_UPLOAD_SYSTEM_H

/// The open(2) flag for direct I/O (O_DIRECT), or 0 where the system has none.
/// Its value differs between architectures and Swift's Glibc module does not export it.
int upload_o_direct_flag(void);

#endif
