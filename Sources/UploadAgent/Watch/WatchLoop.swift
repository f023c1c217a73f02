#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials
import UploadProtocol

/// The watcher's state, owned by its thread: the watch descriptors, files still being written, changes to report.
struct WatchLoop {
    let inotify: Inotify
    let options: DirectoryWatcher.Options
    /// A watched directory: its path, its path from the root's parent, and what it was when the watch was added (device
    /// and inode). A file's event counts only while the path still leads to that same directory: one moved away, or
    /// replaced by a link, reports nothing of what is now at its path.
    struct Watched {
        var path: String
        var relative: String
        var identity: [UInt64]
    }

    /// Watched directories by watch descriptor.
    private var directories: [Int32: Watched] = [:]
    /// Files written without a close yet, by path: their watch, and when they last changed.
    private var pending: [String: (relative: String, wd: Int32, since: Double)] = [:]
    /// Paths said skipped (a FIFO written to again, a link touched): said once, until they go.
    private var skippedPaths = Set<String>()
    private var changes: [DirectoryWatcher.Change] = []
    private var buffer = [UInt8](repeating: 0, count: 64 << 10)

    init(inotify: Inotify, options: DirectoryWatcher.Options) {
        self.inotify = inotify
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

    private var walker: DirectoryWalker { DirectoryWalker(followSymlinks: self.options.followSymlinks) }

    /// Watches `path` and everything under it, reporting complete files (and noting files still being written), and
    /// what it does not take, with why.
    private mutating func walk(
        _ path: String, relative: String, isRoot: Bool = false, deliver: (([DirectoryWatcher.Change]) -> Void)? = nil
    ) throws {
        // Below a root, never through a link unless links are followed (the root is the one the user named).
        let follow = isRoot || self.options.followSymlinks
        let wd: Int32
        switch self.inotify.addWatch(path, follow: follow) {
        case .success(let watch):
            wd = watch
        case .failure(let error):
            let reason = error.description
            if isRoot || error.code == ENOSPC {
                throw SourceError(
                    error.code == ENOSPC
                        ? "cannot watch \(path): the system's inotify watch limit is reached (raise fs.inotify.max_user_watches)"
                        : "cannot watch \(path): \(reason)"
                )
            }
            if error.code == ENOENT { return }  // Removed meanwhile.
            self.changes.append(.skipped(path: path, relative: relative, reason: "the directory cannot be watched: \(reason.lowercased())"))
            return
        }
        // A directory watched already (a link, followed, that leads back to one): walked once.
        guard self.directories[wd] == nil else { return }
        var info = stat()
        guard (follow ? stat(path, &info) : lstat(path, &info)) == 0, (info.st_mode & S_IFMT) == S_IFDIR else {
            self.inotify.removeWatch(wd)
            return
        }
        self.directories[wd] = Watched(path: path, relative: relative, identity: [UInt64(info.st_dev), UInt64(info.st_ino)])
        let names: [[UInt8]]
        switch DirectoryWalker.entries(path) {
        case .names(let found): names = found
        case .unreadable(let reason):
            self.changes.append(
                .skipped(path: path, relative: relative, reason: DirectoryWalker.unreadable(reason))
            )
            return
        }
        let now = Self.now()
        for bytes in names {
            guard let name = String(validating: bytes, as: UTF8.self) else {
                let shown = String(decoding: bytes, as: UTF8.self)
                self.changes.append(
                    .skipped(path: path + "/" + shown, relative: relative + "/" + shown, reason: DirectoryWalker.notUTF8)
                )
                continue
            }
            let full = path + "/" + name
            let sub = relative + "/" + name
            switch self.walker.classify(full, following: self.options.followSymlinks) {
            case .directory:
                if self.options.filter.takesDirectory(name: name, relative: sub) {
                    try self.walk(full, relative: sub, deliver: deliver)
                }
            case .file:
                guard self.options.filter.takesFile(name: name, relative: sub) else { continue }
                var info = stat()
                guard (self.options.followSymlinks ? stat(full, &info) : lstat(full, &info)) == 0 else { continue }
                let modified = Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9
                if Date().timeIntervalSince1970 - modified >= self.settleSeconds {
                    self.ready(full, relative: sub, in: wd)
                    if let deliver, self.changes.count >= Self.scanBatch { deliver(self.takeChanges()) }
                } else {
                    self.pending[full] = (sub, wd, now)
                }
            case .skip(let reason):
                guard self.options.filter.takesFile(name: name, relative: sub) else { continue }
                self.skipped(full, relative: sub, reason: reason)
            case .missing:
                continue
            }
        }
    }

    /// Reports the file at `path` complete, with its fingerprint now, if the directory watched as `wd` is still at its
    /// path (nothing is reported through a directory moved away or replaced by a link since it was watched).
    private mutating func ready(_ path: String, relative: String, in wd: Int32) {
        guard self.stillWatched(wd),
            let info = FileSource.currentInfo(path: path, followSymlinks: self.options.followSymlinks)
        else { return }
        self.skippedPaths.remove(path)
        self.changes.append(.ready(path: path, relative: relative, fingerprint: info.fingerprint))
    }

    /// Says `path` is not taken, once until it goes.
    private mutating func skipped(_ path: String, relative: String, reason: String) {
        guard self.skippedPaths.insert(path).inserted else { return }
        self.changes.append(.skipped(path: path, relative: relative, reason: reason))
    }

    /// Whether the directory watched as `wd` is still the one at its path.
    private func stillWatched(_ wd: Int32) -> Bool {
        guard let directory = self.directories[wd] else { return false }
        var info = stat()
        let follow = self.options.followSymlinks || self.options.roots.contains(directory.path)
        guard (follow ? stat(directory.path, &info) : lstat(directory.path, &info)) == 0, (info.st_mode & S_IFMT) == S_IFDIR else {
            return false
        }
        return [UInt64(info.st_dev), UInt64(info.st_ino)] == directory.identity
    }

    /// Stops watching `path` and everything under it (moved away or deleted): its old path now names something else.
    private mutating func forget(_ path: String) {
        for (wd, directory) in self.directories where directory.path == path || directory.path.hasPrefix(path + "/") {
            self.inotify.removeWatch(wd)
            self.directories[wd] = nil
        }
        for file in self.pending.keys where file.hasPrefix(path + "/") { self.pending[file] = nil }
        for file in self.skippedPaths where file == path || file.hasPrefix(path + "/") { self.skippedPaths.remove(file) }
    }

    /// Why the path `path` is not taken now (a symbolic link, a FIFO), or nil when it is a file or is gone.
    private func skipReason(_ path: String) -> String? {
        if case .skip(let reason) = self.walker.classify(path, following: self.options.followSymlinks) { return reason }
        return nil
    }

    // MARK: Events

    /// Waits for events (or until a pending file settles, at most half a second) and handles them.
    mutating func wait() {
        var timeout = 500
        if let oldest = self.pending.values.map({ $0.since }).min() {
            timeout = max(10, min(timeout, Int(((oldest + self.settleSeconds) - Self.now()) * 1000) + 1))
        }
        if self.inotify.wait(milliseconds: timeout) {
            self.readEvents()
        }
        self.settle()
    }

    private mutating func settle() {
        let now = Self.now()
        for (path, file) in self.pending where now - file.since >= self.settleSeconds {
            self.pending[path] = nil
            guard self.stillWatched(file.wd) else { continue }
            if FileSource.currentInfo(path: path, followSymlinks: self.options.followSymlinks) != nil {
                self.ready(path, relative: file.relative, in: file.wd)
            } else if let reason = self.skipReason(path) {
                // A link (or a FIFO) made where files are watched: not taken, and said so.
                self.skipped(path, relative: file.relative, reason: reason)
            } else if self.options.followSymlinks, case .directory = self.walker.classify(path, following: true) {
                // A link to a directory, followed: walked and watched as one.
                try? self.walk(path, relative: file.relative)
            }
        }
    }

    private mutating func readEvents() {
        while true {
            let events = self.inotify.read(into: &self.buffer)
            guard !events.isEmpty else { return }
            for event in events {
                // A name that is not UTF-8 cannot make a key (nor a path here): said, with its bytes shown as best they can.
                let name = String(validating: event.name, as: UTF8.self) ?? Self.invalidMark + String(decoding: event.name, as: UTF8.self)
                self.handle(event.wd, event.mask, name)
            }
        }
    }

    /// Put before an event's name that is not UTF-8 (which no file name here can start with: it is a NUL).
    static let invalidMark = "\u{0}"

    private mutating func handle(_ wd: Int32, _ mask: UInt32, _ name: String) {
        if mask & Inotify.overflow != 0 {
            // Events were lost: look at everything again (files done before are skipped by the queue).
            self.pending.removeAll()
            for wd in self.directories.keys { self.inotify.removeWatch(wd) }
            self.directories.removeAll()
            try? self.scanAll()
            return
        }
        if mask & Inotify.ignored != 0 {
            self.directories[wd] = nil
            return
        }
        if mask & (Inotify.moveSelf | Inotify.deleteSelf) != 0, let directory = self.directories[wd] {
            // The directory itself went (its move into a watched place is reported there, as a new directory).
            if !self.options.roots.contains(directory.path) { self.forget(directory.path) }
            return
        }
        guard let directory = self.directories[wd], !name.isEmpty else { return }
        if name.hasPrefix(Self.invalidMark) {
            let shown = String(name.dropFirst(Self.invalidMark.count))
            if mask & (Inotify.create | Inotify.movedTo) != 0 {
                self.skipped(
                    directory.path + "/" + shown, relative: directory.relative + "/" + shown,
                    reason: DirectoryWalker.notUTF8
                )
            }
            return
        }
        let path = directory.path + "/" + name
        let relative = directory.relative + "/" + name
        // Nothing is reported through a directory that is no longer the one watched at its path.
        guard self.stillWatched(wd) else { return }
        if mask & Inotify.isDirectory != 0 {
            if mask & (Inotify.delete | Inotify.movedFrom) != 0 {
                // Moved away or deleted: its watches go with it, and its old path is watched again only if one comes.
                self.forget(path)
            } else if mask & (Inotify.create | Inotify.movedTo) != 0, self.options.filter.takesDirectory(name: name, relative: relative) {
                // Files may have landed in it before the watch was added: the walk reports them.
                try? self.walk(path, relative: relative)
            }
            return
        }
        guard self.options.filter.takesFile(name: name, relative: relative) else { return }
        if mask & (Inotify.delete | Inotify.movedFrom) != 0 {
            self.pending[path] = nil
            self.skippedPaths.remove(path)
            self.changes.append(.removed(path: path, relative: relative))
        } else if mask & (Inotify.closeWrite | Inotify.movedTo) != 0 {
            self.pending[path] = nil
            guard let info = FileSource.currentInfo(path: path, followSymlinks: self.options.followSymlinks) else {
                // A link moved in (a FIFO, a device): never opened through, and said so.
                if mask & Inotify.movedTo != 0, let reason = self.skipReason(path) {
                    self.skipped(path, relative: relative, reason: reason)
                }
                return
            }
            if info.size == 0 && mask & Inotify.closeWrite != 0 {
                // Created empty and closed: most writers open it again to fill it. It goes up once settled.
                self.pending[path] = (relative, wd, Self.now())
            } else {
                self.ready(path, relative: relative, in: wd)
            }
        } else if mask & (Inotify.create | Inotify.modify) != 0 {
            self.pending[path] = (relative, wd, Self.now())
        }
    }
}
