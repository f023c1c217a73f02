#if canImport(Glibc)
import Glibc
#endif

/// The modes of the directories and files the relay creates (its data directory, catalog, staging, spool and
/// objects): private to the relay's user by default, whatever the umask. Group access is asked for explicitly
/// (`upload-relay serve --group-access`): the group may then read, never write.
public struct FileModes: Hashable, Sendable {
    /// The mode of each directory created.
    public var directory: mode_t
    /// The mode of each file created.
    public var file: mode_t

    public init(directory: mode_t, file: mode_t) {
        self.directory = directory
        self.file = file
    }

    /// Directories 0700, files 0600: only the relay's user.
    public static let `private` = FileModes(directory: 0o700, file: 0o600)
    /// Directories 0750, files 0640: the relay's group may read.
    public static let groupReadable = FileModes(directory: 0o750, file: 0o640)

    /// The process umask that lets these modes through and nothing wider (files a library or a hook creates with the
    /// usual 0666 or 0644 get no more than `file`).
    public var umask: mode_t { ~self.directory & 0o777 }
}
