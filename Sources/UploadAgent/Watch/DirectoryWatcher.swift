#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials
import NIOConcurrencyHelpers

/// Watches directory trees with inotify and reports files once they are complete: closed after writing, moved in, or
/// left unchanged for the settle time (a writer that keeps its file open). A scan at start reports what is there; a
/// file deleted or moved away is reported removed. Idle, it sleeps in `poll` and costs nothing.
public final class DirectoryWatcher: Sendable {
    /// What changed under a root.
    public enum Change: Hashable, Sendable {
        /// A complete regular file: `relative` is its path from the root's parent (`Pictures/2026/a.jpg`); `fingerprint` is
        /// what it was when found complete (the uploader refuses a file that no longer has it).
        case ready(path: String, relative: String, fingerprint: [UInt8])
        /// A file deleted or moved out.
        case removed(path: String, relative: String)
        /// A path found and not taken, and why: a symbolic link (unless followed), a FIFO or device, a directory that
        /// cannot be read, a name that is not UTF-8. Said once when found (scan, creation, move).
        case skipped(path: String, relative: String, reason: String)
    }

    public struct Options: Sendable {
        /// Directories to watch, recursively.
        public var roots: [String]
        /// How long a file written without a close must stay unchanged before it counts as complete.
        public var settle: Duration = .seconds(2)
        public var filter = PathFilter()
        /// Take what symbolic links point to (`watch --follow-symlinks`); by default a link is skipped and said so.
        public var followSymlinks = false

        /// `roots` relative to the working directory are made absolute: every path reported is.
        public init(roots: [String]) {
            self.roots = roots.map(ItemPlanner.absolute)
        }
    }

    private let options: Options
    private let onChanges: @Sendable ([Change]) -> Void
    private let stopped = NIOLockedValueBox(false)

    /// `onChanges` is called from the watcher's thread, in batches.
    public init(options: Options, onChanges: @escaping @Sendable ([Change]) -> Void) {
        self.options = options
        self.onChanges = onChanges
    }

    /// Sets up the watches, scans every root (reporting what is complete there), then watches on a thread of its own
    /// until ``stop()``.
    public func start() throws {
        let inotify = try Inotify()
        var loop = WatchLoop(inotify: inotify, options: self.options)
        for root in self.options.roots {
            guard Platform.isDirectory(root) else {
                inotify.close()
                throw SourceError("\(root): not a directory (watch takes directories)")
            }
        }
        do {
            try loop.scanAll(deliver: self.onChanges)
        } catch {
            inotify.close()
            throw error
        }
        self.onChanges(loop.takeChanges())
        let scanned = loop
        do {
            try Platform.startThread { [self] in
                var loop = scanned
                while !self.stopped.withLockedValue({ $0 }) {
                    loop.wait()
                    let changes = loop.takeChanges()
                    if !changes.isEmpty { self.onChanges(changes) }
                }
                loop.inotify.close()
            }
        } catch {
            inotify.close()
            throw error
        }
    }

    /// Stops watching (within half a second).
    public func stop() {
        self.stopped.withLockedValue { $0 = true }
    }
}

/// Which files a watch or a send takes, as rclone's filters: with `--include` patterns, only files matching one;
/// never a file or directory matching an `--exclude` pattern. A pattern without `/` matches a name, one with `/`
/// the path from the root's parent; `*`, `?` and `[...]` as in the shell.
public struct PathFilter: Hashable, Sendable {
    public var include: [String] = []
    public var exclude: [String] = []

    public init(include: [String] = [], exclude: [String] = []) {
        self.include = include
        self.exclude = exclude
    }

    static func matches(_ pattern: String, name: String, relative: String) -> Bool {
        let subject = pattern.contains("/") ? relative : name
        return fnmatch(pattern, subject, 0) == 0
    }

    /// Whether the directory is walked at all.
    public func takesDirectory(name: String, relative: String) -> Bool {
        !self.exclude.contains { Self.matches($0, name: name, relative: relative) }
    }

    /// Whether the file is uploaded.
    public func takesFile(name: String, relative: String) -> Bool {
        if self.exclude.contains(where: { Self.matches($0, name: name, relative: relative) }) { return false }
        return self.include.isEmpty || self.include.contains { Self.matches($0, name: name, relative: relative) }
    }
}
