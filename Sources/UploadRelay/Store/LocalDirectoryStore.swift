#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import NIOCore
import UploadProtocol

/// The default store: the object for key K is the plain file `<root>/K` (issue 3).
///
/// Staged bytes live in `stagingDirectory`, on the same file system as `root`, so that commit is
/// one `rename(2)`: fsync the file, rename it into place, fsync the directory. No partial object
/// is ever visible under its key.
public final class LocalDirectoryStore: BlobStore {
    public let root: String
    public let stagingDirectory: String
    /// The most bytes of the aligned buffer each open staging file writes through with direct I/O; 0 writes
    /// through the page cache (see ``LocalStagingFile``).
    public let directBuffer: Int

    /// The default ``directBuffer``: 1 MiB per open upload.
    public static let defaultDirectBuffer = 1 << 20
    /// The largest ``directBuffer`` accepted: 1 GiB.
    public static let maxDirectBuffer = 1 << 30

    /// Creates both directories when missing.
    public init(root: String, stagingDirectory: String, directBuffer: Int = LocalDirectoryStore.defaultDirectBuffer) throws {
        self.root = Self.trimmed(root)
        self.stagingDirectory = Self.trimmed(stagingDirectory)
        self.directBuffer = min(max(0, directBuffer), Self.maxDirectBuffer)
        try Self.makeDirectories(self.root)
        try Self.makeDirectories(self.stagingDirectory)
        var rootStat = stat()
        var stagingStat = stat()
        guard stat(self.root, &rootStat) == 0, stat(self.stagingDirectory, &stagingStat) == 0 else {
            throw StoreError("cannot stat \(self.root) or \(self.stagingDirectory): \(Self.reason())")
        }
        guard rootStat.st_dev == stagingStat.st_dev else {
            throw StoreError(
                "\(self.stagingDirectory) and \(self.root) are on different file systems; commit needs one rename (put --data and --store on one file system)"
            )
        }
    }

    private static func trimmed(_ path: String) -> String {
        var p = path
        while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
        return p
    }

    static func reason(_ code: Int32 = errno) -> String {
        String(cString: strerror(code))
    }

    static func makeDirectories(_ path: String) throws {
        var current = path.hasPrefix("/") ? "" : "."
        for part in path.split(separator: "/") {
            current += "/" + part
            if mkdir(current, 0o755) != 0 && errno != EEXIST {
                throw StoreError("cannot create directory \(current): \(reason())", isNoSpace: errno == ENOSPC)
            }
        }
    }

    public func openStaging(_ name: String, truncatingTo offset: Int64) throws -> any StagingFile {
        precondition(!name.contains("/"), "staging names are flat")
        let path = self.stagingDirectory + "/" + name
        // A resume never creates: a missing staging file (a crash between commit's rename and
        // its catalog record) must not turn into a file of zeros below the durable offset.
        let fd = open(path, O_RDWR | O_CLOEXEC | (offset == 0 ? O_CREAT | O_TRUNC : 0), 0o644)
        guard fd >= 0 else {
            throw StoreError("cannot open staging file \(path): \(Self.reason())", isNoSpace: errno == ENOSPC)
        }
        var info = stat()
        guard fstat(fd, &info) == 0, Int64(info.st_size) >= offset else {
            Glibc.close(fd)
            throw StoreError("staging file \(path) holds fewer than its \(offset) durable bytes")
        }
        guard ftruncate(fd, off_t(offset)) == 0 else {
            let message = Self.reason()
            Glibc.close(fd)
            throw StoreError("cannot cut staging file \(path) to \(offset) bytes: \(message)")
        }
        // The staging file's name must survive a crash too: a resume finds it after a restart.
        try Self.syncDirectory(self.stagingDirectory)
        return LocalStagingFile(name: name, path: path, descriptor: fd, offset: offset, directBuffer: self.directBuffer)
    }

    public func removeStaging(_ name: String) throws {
        let path = self.stagingDirectory + "/" + name
        if unlink(path) != 0 && errno != ENOENT {
            throw StoreError("cannot remove staging file \(path): \(Self.reason())")
        }
    }

    /// The object's path, after checking that no symbolic link leads its directory out of the store.
    private func placeFor(_ key: ObjectKey) throws -> (directory: String, path: String) {
        let segments = key.segments
        let directory = ([self.root] + segments.dropLast().map(String.init)).joined(separator: "/")
        try Self.makeDirectories(directory)
        guard let realRoot = realpath(self.root, nil), let realDirectory = realpath(directory, nil) else {
            throw StoreError("cannot resolve \(directory): \(Self.reason())")
        }
        defer {
            free(realRoot)
            free(realDirectory)
        }
        let rootPath = String(cString: realRoot)
        let directoryPath = String(cString: realDirectory)
        guard directoryPath == rootPath || directoryPath.hasPrefix(rootPath == "/" ? "/" : rootPath + "/") else {
            throw StoreError("key \"\(key)\" leads through a symbolic link out of the store \(self.root)")
        }
        return (directory, directory + "/" + String(segments.last!))
    }

    public func commit(_ staging: any StagingFile, as key: ObjectKey) throws {
        guard let file = staging as? LocalStagingFile else {
            preconditionFailure("a LocalDirectoryStore commits only its own staging files")
        }
        try file.seal()
        let (directory, path) = try self.placeFor(key)
        var existing = stat()
        if lstat(path, &existing) == 0 && (existing.st_mode & S_IFMT) == S_IFDIR {
            throw StoreError("cannot store \"\(key)\": \(path) is a directory")
        }
        guard rename(file.path, path) == 0 else {
            throw StoreError("cannot rename \(file.path) to \(path): \(Self.reason())")
        }
        file.close()
        try Self.syncDirectory(directory)
    }

    public func duplicate(_ source: ObjectKey, as key: ObjectKey) throws {
        let from = self.root + "/" + source.value
        let (directory, path) = try self.placeFor(key)
        let temporary = self.stagingDirectory + "/dup-" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        // A hard link shares the bytes; the rename keeps the new name atomic.
        if link(from, temporary) != 0 {
            try Self.copyFile(from, to: temporary)
        }
        guard rename(temporary, path) == 0 else {
            let message = Self.reason()
            unlink(temporary)
            throw StoreError("cannot place a copy of \"\(source)\" at \(path): \(message)")
        }
        try Self.syncDirectory(directory)
    }

    private static func copyFile(_ from: String, to: String) throws {
        let input = open(from, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw StoreError("cannot open \(from): \(reason())") }
        defer { Glibc.close(input) }
        let output = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard output >= 0 else { throw StoreError("cannot create \(to): \(reason())", isNoSpace: errno == ENOSPC) }
        defer { Glibc.close(output) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(input, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw StoreError("cannot read \(from): \(reason())") }
            if n == 0 { break }
            var done = 0
            while done < n {
                let w = buffer.withUnsafeBytes { write(output, $0.baseAddress! + done, n - done) }
                if w < 0 && errno == EINTR { continue }
                guard w > 0 else { throw StoreError("cannot write \(to): \(reason())", isNoSpace: errno == ENOSPC) }
                done += w
            }
        }
        guard fsync(output) == 0 else { throw StoreError("cannot fsync \(to): \(reason())") }
    }

    static func syncDirectory(_ directory: String) throws {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw StoreError("cannot open directory \(directory): \(reason())") }
        defer { Glibc.close(fd) }
        guard fsync(fd) == 0 else { throw StoreError("cannot fsync directory \(directory): \(reason())") }
    }

    public func size(of key: ObjectKey) throws -> Int64? {
        var info = stat()
        guard lstat(self.root + "/" + key.value, &info) == 0 else { return nil }
        guard (info.st_mode & S_IFMT) == S_IFREG else { return nil }
        return Int64(info.st_size)
    }

    public func stagingNames() throws -> [String] {
        guard let dir = opendir(self.stagingDirectory) else {
            throw StoreError("cannot list \(self.stagingDirectory): \(Self.reason())")
        }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(cString: raw.bindMemory(to: CChar.self).baseAddress!)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }
}
