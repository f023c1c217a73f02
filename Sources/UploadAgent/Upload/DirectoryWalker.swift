#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials

/// What the agent takes from the file system, the same way for `send`, a watch's scans and its events: regular files,
/// and directories walked. A symbolic link is skipped unless `followSymlinks` (then what it points to is taken, a
/// directory walked once whatever the links to it); so are FIFOs, sockets and devices, a directory that cannot be read,
/// and a name that is not UTF-8. Every path it does not take is reported, with why.
struct DirectoryWalker {
    /// Take what symbolic links point to (`--follow-symlinks`); else each link is skipped and said so.
    let followSymlinks: Bool

    /// What is at a path.
    enum Kind: Equatable {
        /// A regular file, with its fingerprint (``FileSource/fingerprint(_:startOffset:)``) and size now.
        case file(fingerprint: [UInt8], size: UInt64)
        /// A directory, and what identifies it (device, inode).
        case directory(identity: [UInt64])
        /// Not taken, and why.
        case skip(String)
        /// Nothing there (or it cannot be looked at).
        case missing(String)
    }

    /// What a walk meets.
    enum Found {
        /// A file to upload: its path (absolute, as walked), its path from the walked directory's parent, the path as
        /// the user sees it, its fingerprint and its size.
        case file(path: String, relative: String, display: String, fingerprint: [UInt8], size: UInt64)
        /// A path not taken, and why.
        case skipped(display: String, reason: String)
    }

    /// Why a link is skipped.
    static let notFollowed = "a symbolic link: not followed (--follow-symlinks uploads what links point to)"
    /// Why a name that is not UTF-8 is skipped.
    static let notUTF8 = "the name is not valid UTF-8, and keys are UTF-8: rename it"

    /// Why a directory is skipped that cannot be opened or listed (`reason`, as the system says it).
    static func unreadable(_ reason: String) -> String {
        "the directory cannot be read (\(reason.lowercased())): nothing in it is uploaded"
    }

    /// The system's words for the last error.
    static func lastError() -> String {
        String(cString: strerror(errno))
    }

    /// What is at `path`; a symbolic link is looked through when `following`.
    func classify(_ path: String, following: Bool) -> Kind {
        Self.classify(following: following) { info, through in through ? stat(path, &info) : lstat(path, &info) }
    }

    /// What `look` finds: it fills in the `stat` of one path, through a link when asked (`stat`) or not (`lstat`), and
    /// answers as they do.
    static func classify(following: Bool, look: (inout stat, _ throughLink: Bool) -> Int32) -> Kind {
        var info = stat()
        guard look(&info, false) == 0 else {
            let code = errno
            let reason = Self.lastError().lowercased()
            // Not there: missing. There but not to be looked at (a directory without search permission): skipped, said.
            return code == ENOENT || code == ENOTDIR ? .missing(reason) : .skip("cannot be looked at (\(reason))")
        }
        if (info.st_mode & S_IFMT) == S_IFLNK {
            guard following else { return .skip(Self.notFollowed) }
            guard look(&info, true) == 0 else { return .skip("a symbolic link to nothing (\(Self.lastError()))") }
        }
        switch info.st_mode & S_IFMT {
        case S_IFREG: return .file(fingerprint: FileSource.fingerprint(info), size: UInt64(max(0, info.st_size)))
        case S_IFDIR: return .directory(identity: [UInt64(info.st_dev), UInt64(info.st_ino)])
        default: return .skip("not a regular file (\(Self.kind(info.st_mode)))")
        }
    }

    /// What a file that is neither regular nor a directory is, for people.
    static func kind(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFIFO: return "a FIFO"
        case S_IFSOCK: return "a socket"
        case S_IFCHR, S_IFBLK: return "a device"
        default: return "not a file"
        }
    }

    /// A directory's names, or why it cannot be read.
    enum Listing {
        case names([[UInt8]])
        case unreadable(String)
    }

    /// The names in `path` as bytes, sorted.
    static func entries(_ path: String) -> Listing {
        guard let directory = opendir(path) else { return .unreadable(Self.lastError()) }
        defer { closedir(directory) }
        return Self.names(in: directory)
    }

    /// The names an open directory holds but `.` and `..`, as bytes, sorted; or why it could not be read to its end.
    static func names(in directory: OpaquePointer) -> Listing {
        var names: [[UInt8]] = []
        errno = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in Array(raw.prefix { $0 != 0 }) }
            if name == [0x2E] || name == [0x2E, 0x2E] { continue }
            names.append(name)
        }
        if errno != 0 { return .unreadable(Self.lastError()) }
        return .names(names.sorted { $0.lexicographicallyPrecedes($1) })
    }

    /// Walks the directory `path` (its path from its parent is `relative`, as the user sees it `display`), calling
    /// `visit` for every file taken and every path skipped, in name order, depth first.
    ///
    /// Directories are opened relative to their parent's descriptor, never by path, and never through a link unless
    /// `followSymlinks`: a directory swapped for a link while the walk runs is not walked through. (A file is opened by
    /// its path later, with `O_NOFOLLOW`, and must still have the fingerprint taken here.)
    func walk(_ path: String, relative: String, display: String, followingRoot: Bool = false, visit: (Found) -> Void) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (followingRoot || self.followSymlinks ? 0 : O_NOFOLLOW))
        guard fd >= 0 else {
            visit(.skipped(display: display, reason: Self.unreadable(Self.lastError())))
            return
        }
        var visited = Set<[UInt64]>()
        var info = stat()
        if fstat(fd, &info) == 0 { visited.insert([UInt64(info.st_dev), UInt64(info.st_ino)]) }
        self.walk(fd, path: path, relative: relative, display: display, visited: &visited, visit: visit)
    }

    /// Walks the directory open at `fd` (closed when done).
    private func walk(
        _ fd: Int32, path: String, relative: String, display: String, visited: inout Set<[UInt64]>, visit: (Found) -> Void
    ) {
        guard let directory = fdopendir(fd) else {
            visit(.skipped(display: display, reason: Self.unreadable(Self.lastError())))
            close(fd)
            return
        }
        defer { closedir(directory) }
        let names: [[UInt8]]
        switch Self.names(in: directory) {
        case .names(let found): names = found
        case .unreadable(let reason):
            visit(.skipped(display: display, reason: Self.unreadable(reason)))
            return
        }
        let parent = dirfd(directory)
        for bytes in names {
            guard let name = String(validating: bytes, as: UTF8.self) else {
                let shown = display + "/" + String(decoding: bytes, as: UTF8.self)
                visit(.skipped(display: shown, reason: Self.notUTF8))
                continue
            }
            let full = path + "/" + name
            let sub = relative + "/" + name
            let shown = display + "/" + name
            let kind = Self.classify(following: self.followSymlinks) { info, throughLink in
                fstatat(parent, name, &info, throughLink ? 0 : AT_SYMLINK_NOFOLLOW)
            }
            switch kind {
            case .file(let fingerprint, let size):
                visit(.file(path: full, relative: sub, display: shown, fingerprint: fingerprint, size: size))
            case .directory(let identity):
                guard visited.insert(identity).inserted else {
                    visit(.skipped(display: shown, reason: "a directory walked already (a link leads back to it)"))
                    continue
                }
                let child = openat(parent, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (self.followSymlinks ? 0 : O_NOFOLLOW))
                guard child >= 0 else {
                    visit(.skipped(display: shown, reason: Self.unreadable(Self.lastError())))
                    continue
                }
                self.walk(child, path: full, relative: sub, display: shown, visited: &visited, visit: visit)
            case .skip(let reason):
                visit(.skipped(display: shown, reason: reason))
            case .missing:
                // Gone since it was listed: nothing to say of a file deleted meanwhile.
                continue
            }
        }
    }
}
