#if canImport(Glibc)
import Glibc
#endif

/// The file-system steps every store and the relay's data directory share: paths, errno, directories made and synced
/// so that what is in them survives a crash.
package enum FileSystem {
    package static func trimmed(_ path: String) -> String {
        var p = path
        while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
        return p
    }

    package static func reason(_ code: Int32 = errno) -> String {
        String(cString: strerror(code))
    }

    /// Creates every missing directory of `path`; each new one's name is fsynced into its parent, so that a
    /// committed object's path survives a crash, not only its leaf.
    package static func makeDirectories(_ path: String, mode: mode_t) throws {
        var current = path.hasPrefix("/") ? "" : "."
        for part in path.split(separator: "/") {
            let parent = current.isEmpty ? "/" : current
            current += "/" + part
            if mkdir(current, mode) == 0 {
                try Self.syncDirectory(parent)
            } else if errno != EEXIST {
                throw StoreError("cannot create directory \(current): \(reason())", isNoSpace: errno == ENOSPC)
            }
        }
    }

    package static func syncDirectory(_ directory: String) throws {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw StoreError("cannot open directory \(directory): \(reason())") }
        defer { Glibc.close(fd) }
        guard fsync(fd) == 0 else { throw StoreError("cannot fsync directory \(directory): \(reason())") }
    }
}
