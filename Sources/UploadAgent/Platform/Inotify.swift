#if canImport(Glibc)
import Glibc
#endif

/// Linux's inotify: the one piece of the agent that is Linux's alone (`watch`). An instance, its watches and its
/// events; ``WatchLoop`` decides what they mean.
package struct Inotify: Sendable {
    // Linux's values (the C macros, not all of which Swift imports).
    static let closeWrite: UInt32 = 0x0000_0008
    static let movedFrom: UInt32 = 0x0000_0040
    static let movedTo: UInt32 = 0x0000_0080
    static let create: UInt32 = 0x0000_0100
    static let delete: UInt32 = 0x0000_0200
    static let modify: UInt32 = 0x0000_0002
    static let deleteSelf: UInt32 = 0x0000_0400
    static let moveSelf: UInt32 = 0x0000_0800
    static let overflow: UInt32 = 0x0000_4000
    static let ignored: UInt32 = 0x0000_8000
    static let isDirectory: UInt32 = 0x4000_0000
    static let onlyDirectories: UInt32 = 0x0100_0000
    static let dontFollow: UInt32 = 0x0200_0000
    /// What a watched directory reports.
    static let watchMask = closeWrite | movedFrom | movedTo | create | delete | modify | deleteSelf | moveSelf | onlyDirectories

    /// One event: the watch it came from, what happened, and the name in that directory (raw bytes, NULs trimmed).
    struct Event {
        var wd: Int32
        var mask: UInt32
        var name: [UInt8]
    }

    let descriptor: Int32

    /// A new instance, non-blocking, closed on exec.
    init() throws {
        let descriptor = inotify_init1(Int32(O_NONBLOCK | O_CLOEXEC))
        guard descriptor >= 0 else {
            throw SourceError("cannot start watching: inotify_init1: \(String(cString: strerror(errno)))")
        }
        self.descriptor = descriptor
    }

    /// Watches the directory `path` (through a symbolic link only when `follow`): its watch descriptor, or the errno.
    func addWatch(_ path: String, follow: Bool) -> Result<Int32, Errno> {
        let wd = inotify_add_watch(self.descriptor, path, Self.watchMask | (follow ? 0 : Self.dontFollow))
        return wd >= 0 ? .success(wd) : .failure(Errno(errno))
    }

    func removeWatch(_ wd: Int32) {
        inotify_rm_watch(self.descriptor, wd)
    }

    /// Whether events wait, after waiting at most `milliseconds` for some.
    func wait(milliseconds: Int) -> Bool {
        var poller = pollfd(fd: self.descriptor, events: Int16(POLLIN), revents: 0)
        return poll(&poller, 1, Int32(clamping: milliseconds)) > 0
    }

    /// The events one read returns (`buffer` is its space), none when nothing waits.
    func read(into buffer: inout [UInt8]) -> [Event] {
        let count = buffer.withUnsafeMutableBytes { Glibc.read(self.descriptor, $0.baseAddress, $0.count) }
        guard count > 0 else { return [] }
        var events: [Event] = []
        buffer.withUnsafeBytes { raw in
            var at = 0
            // struct inotify_event: wd (i32), mask (u32), cookie (u32), len (u32), name (len bytes, NUL-padded).
            while at + 16 <= count {
                let wd = raw.loadUnaligned(fromByteOffset: at, as: Int32.self)
                let mask = raw.loadUnaligned(fromByteOffset: at + 4, as: UInt32.self)
                let length = Int(raw.loadUnaligned(fromByteOffset: at + 12, as: UInt32.self))
                let name = Array(raw[(at + 16)..<min(count, at + 16 + length)].prefix { $0 != 0 })
                events.append(Event(wd: wd, mask: mask, name: name))
                at += 16 + length
            }
        }
        return events
    }

    func close() {
        _ = Glibc.close(self.descriptor)
    }
}

/// An errno value, with the system's words for it.
package struct Errno: Error, Equatable, Sendable, CustomStringConvertible {
    package var code: Int32

    package init(_ code: Int32) { self.code = code }

    package var description: String { String(cString: strerror(self.code)) }
}
