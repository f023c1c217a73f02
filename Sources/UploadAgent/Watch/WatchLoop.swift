#if canImport(Glibc)
import Glibc
#endif
import Foundation
import UploadProtocol

/// The watcher's state, owned by its thread: the watch descriptors, files still being written, changes to report.
struct WatchLoop {
    let fd: Int32
    let options: DirectoryWatcher.Options
    /// Watched directories by watch descriptor: path and path from the root's parent.
    private var directories: [Int32: (path: String, relative: String)] = [:]
    /// Files written without a close yet, by path: when they last changed.
    private var pending: [String: (relative: String, since: Double)] = [:]
    private var changes: [DirectoryWatcher.Change] = []
    private var buffer = [UInt8](repeating: 0, count: 64 << 10)

    init(fd: Int32, options: DirectoryWatcher.Options) {
        self.fd = fd
        self.options = options
    }

    private var settleSeconds: Double {
        self.options.settle.inSeconds
    }

    static func now() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }

    mutating func takeChanges() -> [DirectoryWatcher.Change] {
        defer { self.changes.removeAll() }
        return self.changes
    }

    // MARK: Scanning

    /// Walks every root; complete files go to `deliver` a thousand at a time as the walk goes (a tree of 100,000
    /// photos is never one list), the last ones through ``takeChanges()``.
    mutating func scanAll(deliver: (([DirectoryWatcher.Change]) -> Void)? = nil) throws {
        for root in self.options.roots {
            let trimmed = root.count > 1 && root.hasSuffix("/") ? String(root.dropLast()) : root
            let name = URL(fileURLWithPath: trimmed).standardizedFileURL.lastPathComponent
            try self.walk(trimmed, relative: name, isRoot: true, deliver: deliver)
        }
    }

    private static let scanBatch = 1000

    /// Watches `path` and everything under it, reporting complete files (and noting files still being written).
    private mutating func walk(
        _ path: String, relative: String, isRoot: Bool = false, deliver: (([DirectoryWatcher.Change]) -> Void)? = nil
    ) throws {
        let wd = inotify_add_watch(self.fd, path, DirectoryWatcher.watchMask)
        guard wd >= 0 else {
            let reason = String(cString: strerror(errno))
            if isRoot || errno == ENOSPC {
                throw SourceError(
                    errno == ENOSPC
                        ? "cannot watch \(path): the system's inotify watch limit is reached (raise fs.inotify.max_user_watches)"
                        : "cannot watch \(path): \(reason)"
                )
            }
            return  // Removed meanwhile, or unreadable: skipped.
        }
        self.directories[wd] = (path, relative)
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: path) else { return }
        let now = Self.now()
        for name in entries.sorted() {
            let full = path + "/" + name
            let sub = relative + "/" + name
            var info = stat()
            guard lstat(full, &info) == 0 else { continue }
            switch info.st_mode & S_IFMT {
            case S_IFDIR:
                if self.options.filter.takesDirectory(name: name, relative: sub) {
                    try self.walk(full, relative: sub, deliver: deliver)
                }
            case S_IFREG:
                guard self.options.filter.takesFile(name: name, relative: sub) else { continue }
                let modified = Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9
                if Date().timeIntervalSince1970 - modified >= self.settleSeconds {
                    self.changes.append(.ready(path: full, relative: sub))
                    if let deliver, self.changes.count >= Self.scanBatch { deliver(self.takeChanges()) }
                } else {
                    self.pending[full] = (sub, now)
                }
            default:
                continue
            }
        }
    }

    // MARK: Events

    /// Waits for events (or until a pending file settles, at most half a second) and handles them.
    mutating func wait() {
        var timeout = 500
        if let oldest = self.pending.values.map(\.since).min() {
            timeout = max(10, min(timeout, Int(((oldest + self.settleSeconds) - Self.now()) * 1000) + 1))
        }
        var poller = pollfd(fd: self.fd, events: Int16(POLLIN), revents: 0)
        if poll(&poller, 1, Int32(timeout)) > 0 {
            self.readEvents()
        }
        self.settle()
    }

    private mutating func settle() {
        let now = Self.now()
        for (path, file) in self.pending where now - file.since >= self.settleSeconds {
            self.pending[path] = nil
            if FileSource.currentInfo(path: path) != nil {
                self.changes.append(.ready(path: path, relative: file.relative))
            }
        }
    }

    private mutating func readEvents() {
        while true {
            let count = self.buffer.withUnsafeMutableBytes { read(self.fd, $0.baseAddress, $0.count) }
            guard count > 0 else { return }
            var events: [(wd: Int32, mask: UInt32, name: String)] = []
            self.buffer.withUnsafeBytes { raw in
                var at = 0
                // struct inotify_event: wd (i32), mask (u32), cookie (u32), len (u32), name (len bytes, NUL-padded).
                while at + 16 <= count {
                    let wd = raw.loadUnaligned(fromByteOffset: at, as: Int32.self)
                    let mask = raw.loadUnaligned(fromByteOffset: at + 4, as: UInt32.self)
                    let length = Int(raw.loadUnaligned(fromByteOffset: at + 12, as: UInt32.self))
                    let nameBytes = raw[(at + 16)..<min(count, at + 16 + length)].prefix { $0 != 0 }
                    events.append((wd, mask, String(decoding: nameBytes, as: UTF8.self)))
                    at += 16 + length
                }
            }
            for event in events { self.handle(event.wd, event.mask, event.name) }
        }
    }

    private mutating func handle(_ wd: Int32, _ mask: UInt32, _ name: String) {
        if mask & DirectoryWatcher.overflow != 0 {
            // Events were lost: look at everything again (files done before are skipped by the queue).
            self.pending.removeAll()
            for wd in self.directories.keys { inotify_rm_watch(self.fd, wd) }
            self.directories.removeAll()
            try? self.scanAll()
            return
        }
        if mask & DirectoryWatcher.ignored != 0 {
            self.directories[wd] = nil
            return
        }
        guard let directory = self.directories[wd], !name.isEmpty else { return }
        let path = directory.path + "/" + name
        let relative = directory.relative + "/" + name
        if mask & DirectoryWatcher.isDirectory != 0 {
            if mask & (DirectoryWatcher.create | DirectoryWatcher.movedTo) != 0, self.options.filter.takesDirectory(name: name, relative: relative) {
                // Files may have landed in it before the watch was added: the walk reports them.
                try? self.walk(path, relative: relative)
            }
            return
        }
        guard self.options.filter.takesFile(name: name, relative: relative) else { return }
        if mask & (DirectoryWatcher.delete | DirectoryWatcher.movedFrom) != 0 {
            self.pending[path] = nil
            self.changes.append(.removed(path: path, relative: relative))
        } else if mask & (DirectoryWatcher.closeWrite | DirectoryWatcher.movedTo) != 0 {
            self.pending[path] = nil
            guard let info = FileSource.currentInfo(path: path) else { return }
            if info.size == 0 && mask & DirectoryWatcher.closeWrite != 0 {
                // Created empty and closed: most writers open it again to fill it. It goes up once settled.
                self.pending[path] = (relative, Self.now())
            } else {
                self.changes.append(.ready(path: path, relative: relative))
            }
        } else if mask & (DirectoryWatcher.create | DirectoryWatcher.modify) != 0 {
            self.pending[path] = (relative, Self.now())
        }
    }
}
