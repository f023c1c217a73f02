#if canImport(Glibc)
import Glibc
#endif
import Logging
import NIOConcurrencyHelpers

/// The relay's disk as uploads see it: an OPEN is admitted only when the bytes it will still stage on the relay's own
/// disk fit the free space, less what the uploads open now will still write there, above a reserve (SPEC §7, §10). An
/// upload that could never fit is refused before a byte is staged, instead of failing half-way and leaving its bytes on
/// a full disk until its session expires.
///
/// Each admitted upload's promise is kept under its session's id and shrinks as its bytes are written (they then show in
/// the free space itself); it goes when the upload has written its last byte (at its commit) or ends.
///
/// Files run out as bytes do: each upload stages a file (an inode), and many small uploads exhaust a file system's
/// inodes long before its bytes. So an OPEN also needs a free inode above a reserve of them (a twentieth of the file
/// system's, at most 65,536), less one for each upload open now; a file system that has no inode count (btrfs reports
/// none) is judged by bytes alone.
package final class StorageSpace: Sendable {
    /// What a look at a file system saw: bytes, and inodes when it counts them.
    package struct Look: Sendable {
        var free: Int64
        var size: Int64
        var freeFiles: Int64 = 0
        var files: Int64 = 0
    }

    /// Where the store stages bytes on the relay's disk, and the bytes kept free there.
    let directory: String
    let reserve: Int64
    /// Inodes kept free there (0 when the file system counts none).
    let fileReserve: Int64
    private let logger: Logger
    /// Free bytes and size of the file system holding a directory, and its inodes (``look(_:)``; tests give their own).
    private let measure: @Sendable (String) -> Look?

    private struct State {
        /// Bytes each open upload may still write, by its session's id.
        var promised: [String: Int64] = [:]
        /// Their sum.
        var total: Int64 = 0
        /// Whether the last look found no room (logged once per change).
        var full = false
        /// What the last look saw, for the status endpoint and messages.
        var free: Int64 = 0
    }

    private let state = NIOLockedValueBox(State())

    /// `reserve` nil: the default, 1 GiB or a twentieth of the file system, whichever is smaller.
    init(
        directory: String, reserve: Int64?, logger: Logger,
        measure: @escaping @Sendable (String) -> Look? = StorageSpace.look
    ) {
        self.directory = directory
        self.logger = logger
        self.measure = measure
        let look = measure(directory)
        if let reserve {
            self.reserve = max(0, reserve)
        } else {
            self.reserve = min(Self.defaultReserve, (look?.size ?? 0) / 20)
        }
        self.fileReserve = min(Self.defaultFileReserve, (look?.files ?? 0) / 20)
    }

    /// The inode reserve's ceiling.
    static let defaultFileReserve: Int64 = 65_536

    /// The default reserve's ceiling: 1 GiB.
    static let defaultReserve: Int64 = 1 << 30

    /// Free bytes for an unprivileged writer and the file system's size, or nil when it cannot be asked.
    static func look(_ directory: String) -> Look? {
        var info = statvfs()
        guard statvfs(directory, &info) == 0 else { return nil }
        // Clamped and saturating: a server may report counts no signed 64-bit number holds.
        let unit = Int64(clamping: info.f_frsize)
        func bytes(_ blocks: UInt) -> Int64 {
            let (product, overflow) = Int64(clamping: blocks).multipliedReportingOverflow(by: unit)
            return overflow ? .max : product
        }
        return Look(
            free: bytes(info.f_bavail), size: bytes(info.f_blocks), freeFiles: Int64(clamping: info.f_favail),
            files: Int64(clamping: info.f_files)
        )
    }

    /// Why `bytes` more cannot be staged for the upload `upload` (its session's id), or nil once they are promised to it.
    func admit(_ bytes: Int64, upload: String) -> String? {
        guard let look = self.measure(self.directory) else { return nil }
        let outcome: (refused: String?, changed: Bool, free: Int64, promised: Int64) = self.state.withLockedValue { state in
            let others = state.total - (state.promised[upload] ?? 0)
            let room = look.free - others - self.reserve
            let wasFull = state.full
            state.free = look.free
            // This upload needs a file of its own, unless it is one of those open now.
            if self.lacksFile(look, open: state.promised.count - (state.promised[upload] == nil ? 0 : 1)) {
                state.full = true
                return (
                    "the relay's storage is full (\(max(0, look.freeFiles - self.fileReserve)) files free for uploads); retry later", !wasFull,
                    look.free, others
                )
            }
            guard bytes <= room else {
                state.full = true
                return (
                    "the relay's storage is full (\(max(0, room)) bytes free for uploads, \(bytes) needed); retry later", !wasFull, look.free, others
                )
            }
            state.total = others + max(0, bytes)
            state.promised[upload] = max(0, bytes)
            state.full = look.free - others - bytes < self.reserve
            return (nil, wasFull != state.full, look.free, others)
        }
        if outcome.changed {
            let metadata: Logger.Metadata = [
                "storage.free": "\(outcome.free)", "storage.reserve": "\(self.reserve)", "storage.promised": "\(outcome.promised)",
                "storage.directory": "\(self.directory)",
            ]
            if outcome.refused != nil {
                self.logger.warning("storage full: uploads that do not fit above the reserve are refused until space is freed", metadata: metadata)
            } else {
                self.logger.notice("storage has room again", metadata: metadata)
            }
        }
        return outcome.refused
    }

    /// `bytes` of the upload `upload` were written: they count in the free space now.
    func wrote(_ bytes: Int64, upload: String) {
        self.state.withLockedValue { state in
            guard let left = state.promised[upload] else { return }
            let now = max(0, left - bytes)
            state.promised[upload] = now
            state.total -= left - now
        }
    }

    /// The upload `upload` wrote its last byte, or ended: what it did not write is free again.
    func release(upload: String) {
        self.state.withLockedValue { state in
            guard let left = state.promised.removeValue(forKey: upload) else { return }
            state.total -= left
        }
    }

    /// Bytes promised now, all uploads together.
    package var promised: Int64 { self.state.withLockedValue { $0.total } }

    /// Whether `error` says the relay's disk is full: the store's (ENOSPC, EDQUOT) or the catalog's.
    package static func isDiskFull(_ error: any Error) -> Bool {
        (error as? StoreError)?.isNoSpace == true || (error as? any DiskFullReporting)?.isDiskFull == true
    }

    /// A write found the disk full (something else filled it): said at once, not at the next OPEN.
    func noteFull() {
        let changed = self.state.withLockedValue { state in
            defer { state.full = true }
            return !state.full
        }
        if changed {
            self.logger.warning(
                "storage full: a write found no space left",
                metadata: ["storage.directory": "\(self.directory)", "storage.reserve": "\(self.reserve)"]
            )
        }
    }

    /// Free bytes of the file system under ``directory`` now, or nil when it cannot be asked.
    var free: Int64? { self.measure(self.directory)?.free }

    /// Whether the relay's storage is full now: less free than the reserve and what open uploads will still write, or no
    /// file left above the inode reserve for a new upload.
    var isFull: Bool {
        guard let look = self.measure(self.directory) else { return false }
        return self.state.withLockedValue { state in
            look.free - state.total < self.reserve || self.lacksFile(look, open: state.promised.count)
        }
    }

    /// Whether a new upload finds no file above the inode reserve, besides the `open` uploads staging one now (counted
    /// whether or not their file is made yet). A file system that counts no inodes never lacks one.
    private func lacksFile(_ look: Look, open: Int) -> Bool {
        look.files > 0 && look.freeFiles - Int64(open) - 1 < self.fileReserve
    }
}

/// An error of a backend (a catalog's database) that can say it means the relay's disk is full: such a refusal is
/// retryable, and said as the relay's storage being full.
public protocol DiskFullReporting: Error {
    var isDiskFull: Bool { get }
}
