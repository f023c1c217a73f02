#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// What the agent takes from the file system, the same way for `send`, a watch's scans and its events: regular files,
/// and directories walked. A symbolic link is skipped unless `followSymlinks` (then what it points to is taken, a
/// directory walked once whatever the links to it); so are FIFOs, sockets and devices, a directory that cannot be read,
/// and a name that is not UTF-8. Every path it does not take is reported, with why.
struct DirectoryWalker {
    let followSymlinks: Bool

    /// What is at a path.
    enum Kind: Equatable {
        /// A regular file, with its fingerprint now (``FileSource/fingerprint(_:startOffset:)``).
        case file(fingerprint: [UInt8])
        case directory
        /// Not taken, and why.
        case skip(String)
        /// Nothing there (or it cannot be looked at).
        case missing(String)
    }

    /// What a walk meets.
    enum Found {
        /// A file to upload: its path (absolute, as walked), its path from the walked directory's parent, the path as
        /// the user sees it, and its fingerprint.
        case file(path: String, relative: String, display: String, fingerprint: [UInt8])
        /// A path not taken, and why.
        case skipped(display: String, reason: String)
    }

    static let notFollowed = "a symbolic link: not followed (--follow-symlinks uploads what links point to)"

    /// What is at `path`; a symbolic link is looked through when `following`.
    func classify(_ path: String, following: Bool) -> Kind {
        var info = stat()
        guard lstat(path, &info) == 0 else { return .missing(String(cString: strerror(errno)).lowercased()) }
        if (info.st_mode & S_IFMT) == S_IFLNK {
            guard following else { return .skip(Self.notFollowed) }
            guard stat(path, &info) == 0 else { return .skip("a symbolic link to nothing (\(String(cString: strerror(errno))))") }
        }
        switch info.st_mode & S_IFMT {
        case S_IFREG: return .file(fingerprint: FileSource.fingerprint(info))
        case S_IFDIR: return .directory
        default: return .skip("not a regular file (\(Self.kind(info.st_mode)))")
        }
    }

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
        guard let directory = opendir(path) else { return .unreadable(String(cString: strerror(errno))) }
        defer { closedir(directory) }
        var names: [[UInt8]] = []
        errno = 0
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in Array(raw.prefix { $0 != 0 }) }
            if name == [0x2E] || name == [0x2E, 0x2E] { continue }
            names.append(name)
        }
        if errno != 0 { return .unreadable(String(cString: strerror(errno))) }
        return .names(names.sorted { $0.lexicographicallyPrecedes($1) })
    }

    /// Walks the directory `path` (its path from its parent is `relative`, as the user sees it `display`), calling
    /// `visit` for every file taken and every path skipped, in name order, depth first.
    func walk(_ path: String, relative: String, display: String, visit: (Found) -> Void) {
        var visited = Set<[UInt64]>()
        var info = stat()
        if stat(path, &info) == 0 { visited.insert([UInt64(info.st_dev), UInt64(info.st_ino)]) }
        self.walk(path, relative: relative, display: display, visited: &visited, visit: visit)
    }

    private func walk(_ path: String, relative: String, display: String, visited: inout Set<[UInt64]>, visit: (Found) -> Void) {
        let names: [[UInt8]]
        switch Self.entries(path) {
        case .names(let found): names = found
        case .unreadable(let reason):
            visit(.skipped(display: display, reason: "the directory cannot be read (\(reason.lowercased())): nothing in it was uploaded"))
            return
        }
        for bytes in names {
            guard let name = String(validating: bytes, as: UTF8.self) else {
                let shown = display + "/" + String(decoding: bytes, as: UTF8.self)
                visit(.skipped(display: shown, reason: "the name is not valid UTF-8, and keys are UTF-8: rename it"))
                continue
            }
            let full = path + "/" + name
            let sub = relative + "/" + name
            let shown = display + "/" + name
            switch self.classify(full, following: self.followSymlinks) {
            case .file(let fingerprint):
                visit(.file(path: full, relative: sub, display: shown, fingerprint: fingerprint))
            case .directory:
                var info = stat()
                if stat(full, &info) == 0, !visited.insert([UInt64(info.st_dev), UInt64(info.st_ino)]).inserted {
                    visit(.skipped(display: shown, reason: "a directory walked already (a link leads back to it)"))
                    continue
                }
                self.walk(full, relative: sub, display: shown, visited: &visited, visit: visit)
            case .skip(let reason):
                visit(.skipped(display: shown, reason: reason))
            case .missing:
                // Gone since it was listed: nothing to say of a file deleted meanwhile.
                continue
            }
        }
    }
}
