#if canImport(Glibc)
import UploadRelay
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import UploadChecksums
import UploadProtocol

/// The default store: the object for key K of account A is the plain file `<root>/A/K`.
///
/// Staged bytes live in `stagingDirectory`, on the same file system as `root`, so that commit is
/// one `rename(2)`: fsync the file, rename it into place, fsync the directory. No partial object
/// is ever visible under its key.
public final class LocalDirectoryStore: BlobStore {
    public let root: String
    public let stagingDirectory: String
    /// The most bytes of one direct write, through an aligned buffer the writes under way share; 0 writes through
    /// the page cache (see ``LocalStagingFile``).
    public let directBuffer: Int

    /// The modes of the directories, staging files and objects it creates.
    public let modes: FileModes
    /// Where its system calls run: a caller's task waits for them without holding its thread.
    public let threadPool: NIOThreadPool
    /// The staging files it opened that are alive: only those are committed.
    let opened = StagingRegistry<LocalStagingFile>()

    /// The default ``directBuffer``: 1 MiB.
    public static let defaultDirectBuffer = RelayConfiguration.defaultDirectIOBuffer
    /// The largest ``directBuffer`` accepted: 1 GiB.
    public static let maxDirectBuffer = 1 << 30

    /// Creates both directories when missing. Its system calls run on `threadPool` (started; the caller shuts it down).
    public init(
        root: String, stagingDirectory: String, directBuffer: Int = LocalDirectoryStore.defaultDirectBuffer, modes: FileModes = .private,
        threadPool: NIOThreadPool = .singleton
    ) throws {
        self.threadPool = threadPool
        self.root = FileSystem.trimmed(root)
        self.stagingDirectory = FileSystem.trimmed(stagingDirectory)
        self.directBuffer = min(max(0, directBuffer), Self.maxDirectBuffer)
        self.modes = modes
        try FileSystem.makeDirectories(self.root, mode: modes.directory)
        try FileSystem.makeDirectories(self.stagingDirectory, mode: modes.directory)
        var rootStat = stat()
        var stagingStat = stat()
        guard stat(self.root, &rootStat) == 0, stat(self.stagingDirectory, &stagingStat) == 0 else {
            throw StoreError("cannot stat \(self.root) or \(self.stagingDirectory): \(FileSystem.reason())")
        }
        guard rootStat.st_dev == stagingStat.st_dev else {
            throw StoreError(
                "\(self.stagingDirectory) and \(self.root) are on different file systems; commit needs one rename (put --data and --store on one file system)"
            )
        }
    }

    /// Stripes and reading back: any size a file system takes.
    public var capabilities: StoreCapabilities { StoreCapabilities(stripes: true, largestObject: .max) }

    public func openStaging(_ request: StagingRequest) async throws -> any StagingFile {
        try await self.blocking {
            switch request.layout {
            case .sequential(let offset, _):
                return try self.openStaging(request.name, truncatingTo: offset, expectedSize: request.expectedSize)
            case .striped(let size, let creating):
                return try self.openStripedStaging(request.name, size: size, creating: creating)
            }
        }
    }

    /// An upload that announced fewer bytes than the direct buffer's most writes through the page cache: direct I/O's
    /// set-up (flags, aligned buffer, padded last block, the cut at commit) costs more than the copy it saves.
    private func openStaging(_ name: String, truncatingTo offset: Int64, expectedSize: Int64?) throws -> LocalStagingFile {
        let path = try self.stagingPath(name)
        // A resume never creates: a missing staging file (a crash between commit's rename and
        // its catalog record) must not turn into a file of zeros below the durable offset.
        let fd = open(path, O_RDWR | O_CLOEXEC | (offset == 0 ? O_CREAT | O_TRUNC : 0), self.modes.file)
        guard fd >= 0 else {
            throw StoreError("cannot open staging file \(path): \(FileSystem.reason())", isNoSpace: errno == ENOSPC)
        }
        var info = stat()
        guard fstat(fd, &info) == 0, Int64(info.st_size) >= offset else {
            Glibc.close(fd)
            throw StoreError("staging file \(path) holds fewer than its \(offset) durable bytes")
        }
        guard ftruncate(fd, off_t(offset)) == 0 else {
            let message = FileSystem.reason()
            Glibc.close(fd)
            throw StoreError("cannot cut staging file \(path) to \(offset) bytes: \(message)")
        }
        // The staging file's name must survive a crash too, once a session records it: a resume finds it after a
        // restart. A new file's name is made durable by its first sync (a small upload committed at once never needs it).
        return self.opened.registered(
            LocalStagingFile(
                name: name, path: path, directory: self.stagingDirectory, descriptor: fd, offset: offset,
                directBuffer: (expectedSize ?? .max) < Int64(self.directBuffer) ? 0 : self.directBuffer, nameIsDurable: offset > 0,
                threadPool: self.threadPool, registry: self.opened
            ))
    }

    /// No direct I/O: its buffer writes in order from one offset and cuts the file to what it wrote on close.
    private func openStripedStaging(_ name: String, size: Int64, creating: Bool) throws -> LocalStagingFile {
        let path = try self.stagingPath(name)
        let fd = open(path, O_RDWR | O_CLOEXEC | (creating ? O_CREAT : 0), self.modes.file)
        guard fd >= 0 else {
            throw StoreError("cannot open staging file \(path): \(FileSystem.reason())", isNoSpace: errno == ENOSPC)
        }
        if creating {
            do {
                try FileSystem.syncDirectory(self.stagingDirectory)
            } catch {
                Glibc.close(fd)
                throw error
            }
        }
        return self.opened.registered(
            LocalStagingFile(
                name: name, path: path, directory: self.stagingDirectory, descriptor: fd, offset: size, directBuffer: 0, nameIsDurable: true,
                threadPool: self.threadPool, registry: self.opened
            ))
    }

    /// Every byte of an upload is staged here until its commit renames it into place.
    public func localSpace(forBlobOf size: Int64) -> (directory: String, bytes: Int64) {
        (self.stagingDirectory, size)
    }

    /// Where the staging file `name` is; `name` must be a plain file name.
    private func stagingPath(_ name: String) throws -> String {
        guard !name.isEmpty, !name.contains("/"), name != ".", name != ".." else {
            throw StoreError("staging name \"\(name)\" is not a plain file name")
        }
        return self.stagingDirectory + "/" + name
    }

    public func removeStaging(_ name: String) async throws {
        try await self.blocking {
            let path = self.stagingDirectory + "/" + name
            if unlink(path) != 0 && errno != ENOENT {
                throw StoreError("cannot remove staging file \(path): \(FileSystem.reason())")
            }
        }
    }

    /// The account's folder; its name was checked when the account was made, and is checked again here.
    func accountDirectory(_ account: String) throws -> String {
        guard Account.isValidName(account) else {
            throw StoreError("account name \"\(account)\" cannot be a folder of the store")
        }
        return self.root + "/" + account
    }

    /// The object's path, after checking that no symbolic link leads its directory out of the account's folder.
    /// Directories in `checked` passed that check earlier in the same group commit and are not checked again.
    func placeFor(_ key: ObjectKey, account: String, checked: inout Set<String>) throws -> (directory: String, path: String) {
        let base = try self.accountDirectory(account)
        let segments = key.segments
        let directory = ([base] + segments.dropLast()).joined(separator: "/")
        let path = directory + "/" + (segments.last ?? key.value)
        if checked.contains(directory) { return (directory, path) }
        try FileSystem.makeDirectories(directory, mode: self.modes.directory)
        guard let realBase = realpath(base, nil), let realDirectory = realpath(directory, nil) else {
            throw StoreError("cannot resolve \(directory): \(FileSystem.reason())")
        }
        defer {
            free(realBase)
            free(realDirectory)
        }
        let basePath = String(cString: realBase)
        let directoryPath = String(cString: realDirectory)
        guard directoryPath == basePath || directoryPath.hasPrefix(basePath + "/") else {
            throw StoreError("key \"\(key)\" leads through a symbolic link out of the store \(base)")
        }
        checked.insert(directory)
        return (directory, path)
    }

    func placeFor(_ key: ObjectKey, account: String) throws -> (directory: String, path: String) {
        var checked: Set<String> = []
        return try self.placeFor(key, account: account, checked: &checked)
    }

    public func location(of key: ObjectKey, account: String) throws -> String {
        try self.path(of: key, account: account)
    }

    /// Unlinks the file (through the same checked path a commit takes: no link leads out of the account's folder), syncs
    /// its directory, and removes the folders the key made that are empty now.
    public func removeObject(_ key: ObjectKey, account: String) async throws {
        try await self.blocking {
            var checked = Set<String>()
            let (directory, path) = try self.placeFor(key, account: account, checked: &checked)
            guard unlink(path) == 0 || errno == ENOENT else {
                throw StoreError("cannot remove \(path): \(String(cString: strerror(errno)))")
            }
            let fd = open(directory, O_RDONLY | O_DIRECTORY)
            if fd >= 0 {
                _ = fsync(fd)
                close(fd)
            }
            let base = try self.accountDirectory(account)
            var folder = directory
            while folder.count > base.count, folder.hasPrefix(base + "/"), rmdir(folder) == 0 {
                folder = String(folder[..<(folder.lastIndex(of: "/") ?? folder.endIndex)])
            }
        }
    }

    func path(of key: ObjectKey, account: String) throws -> String {
        try self.accountDirectory(account) + "/" + key.value
    }

    /// Each file cut to size and synced, then renamed into place; then each directory that received one is synced once,
    /// and only then is any of them reported committed. The files of a group are synced at once, each with its own
    /// `fdatasync(2)` on a thread of its own, not one after another (syncs in turn are what a group of small uploads
    /// would wait for). Not one `syncfs(2)` for the group: it would also flush every other writer's data on the file
    /// system, and report their write errors as the group's.
    public func commit(_ batch: [StoreCommit]) async -> [Result<ObjectIdentity, any Error>] {
        do {
            guard batch.count > 1 else {
                // One file: sealed with its own sync and placed in one trip to the thread pool.
                return try await self.blocking {
                    var (results, sealed) = self.sealAll(batch, sync: true)
                    self.placeAll(batch, sealed, grouped: false, into: &results)
                    return results
                }
            }
            var (results, sealed) = try await self.blocking { self.sealAll(batch, sync: false) }
            // The group's syncs at once, each file's own (its errors its own; nothing of other writers' is flushed),
            // rather than one after another: the disk takes them together.
            let failed = await withTaskGroup(of: (Int, (any Error)?).self) { group in
                for (index, file) in sealed {
                    group.addTask {
                        do {
                            try await self.blocking { try file.syncSealed() }
                            return (index, nil)
                        } catch {
                            return (index, error)
                        }
                    }
                }
                var failed: [Int: any Error] = [:]
                for await (index, error) in group { failed[index] = error }
                return failed
            }
            for (index, error) in failed { results[index] = .failure(error) }
            sealed.removeAll { failed[$0.index] != nil }
            return try await self.blocking { [sealed, results] in
                var results = results
                self.placeAll(batch, sealed, grouped: true, into: &results)
                return results
            }
        } catch {
            return batch.map { _ in .failure(StoreError("the relay is stopping: nothing was committed")) }
        }
    }

    /// Seals each item's staging (its bytes durable with `sync`); a failure is that item's result.
    private func sealAll(
        _ batch: [StoreCommit], sync: Bool
    ) -> ([Result<ObjectIdentity, any Error>], [(index: Int, file: LocalStagingFile)]) {
        var results = [Result<ObjectIdentity, any Error>](repeating: .failure(StoreError("not committed")), count: batch.count)
        var sealed: [(index: Int, file: LocalStagingFile)] = []
        for (index, item) in batch.enumerated() {
            do {
                sealed.append((index, try self.seal(item.staging, as: item.key, account: item.account, sync: sync)))
            } catch {
                results[index] = .failure(error)
            }
        }
        return (results, sealed)
    }

    /// Renames each sealed file into place and syncs each directory that received one once; only then is an item's
    /// result its identity.
    private func placeAll(
        _ batch: [StoreCommit], _ sealed: [(index: Int, file: LocalStagingFile)], grouped: Bool,
        into results: inout [Result<ObjectIdentity, any Error>]
    ) {
        var placed: [(index: Int, directory: String, path: String)] = []
        var checked: Set<String> = []
        for (index, file) in sealed {
            let item = batch[index]
            do {
                // Another object of the group may have made this key's place a conflict (a folder where it goes).
                if grouped, let conflict = try self.conflictNow(for: item.key, account: item.account) {
                    throw StoreError(conflict)
                }
                let (directory, path) = try self.renameIntoPlace(file, as: item.key, account: item.account, checked: &checked)
                placed.append((index, directory, path))
            } catch {
                results[index] = .failure(error)
            }
        }
        var directories: [String: StoreError?] = [:]
        for (index, directory, path) in placed {
            if directories[directory] == nil {
                do {
                    try FileSystem.syncDirectory(directory)
                    directories[directory] = .some(nil)
                } catch {
                    directories[directory] = error as? StoreError ?? StoreError("\(error)")
                }
            }
            results[index] = Result {
                if let failure = directories[directory] ?? nil { throw Self.visible(failure) }
                return try Self.identityAfterRename(path)
            }
        }
    }

    /// Seals the staging file for `key` (cut to size; its bytes durable with `sync`), once no object is in the key's way.
    private func seal(_ staging: any StagingFile, as key: ObjectKey, account: String, sync: Bool) throws -> LocalStagingFile {
        guard let file = self.opened.own(staging) else {
            throw StoreError("staging \(staging.name) is not this store's: a local directory store commits only its own staging files")
        }
        if let conflict = try self.conflictNow(for: key, account: account) {
            throw StoreError(conflict)
        }
        try file.seal(sync: sync)
        return file
    }

    /// Renames a sealed staging file to the object's path: visible, its directory not yet synced.
    private func renameIntoPlace(
        _ file: LocalStagingFile, as key: ObjectKey, account: String, checked: inout Set<String>
    ) throws -> (directory: String, path: String) {
        let (directory, path) = try self.placeFor(key, account: account, checked: &checked)
        guard rename(file.path, path) == 0 else {
            throw StoreError("cannot rename \(file.path) to \(path): \(FileSystem.reason())", isNoSpace: errno == ENOSPC)
        }
        file.close()
        return (directory, path)
    }

    /// Syncs the directory an object was renamed into and reads its identity; a failure here leaves a visible object.
    static func afterRename(directory: String, path: String) throws -> ObjectIdentity {
        do {
            try FileSystem.syncDirectory(directory)
        } catch let error as StoreError {
            throw Self.visible(error)
        }
        return try Self.identityAfterRename(path)
    }

    /// The identity of an object just renamed into place; a failure here leaves a visible object.
    static func identityAfterRename(_ path: String) throws -> ObjectIdentity {
        do {
            guard let identity = try Self.identity(at: path) else { throw StoreError("\(path) vanished right after its commit") }
            return identity
        } catch let error as StoreError {
            throw Self.visible(error)
        }
    }

    static func visible(_ error: StoreError) -> StoreError {
        StoreError(error.description, isNoSpace: error.isNoSpace, madeVisible: true)
    }

    public func duplicate(_ source: ObjectKey, expected: ObjectIdentity, as key: ObjectKey, account: String) async throws -> ObjectIdentity {
        try await self.blocking {
            let from = try self.path(of: source, account: account)
            if let conflict = try self.conflictNow(for: key, account: account) {
                throw StoreError(conflict)
            }
            let (directory, path) = try self.placeFor(key, account: account)
            let temporary = self.stagingDirectory + "/dup-" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
            // A hard link shares the bytes; the rename keeps the new name atomic. Objects are only ever replaced by
            // rename, never written in place, so a link to the expected inode holds the expected bytes for good.
            do {
                if link(from, temporary) == 0 {
                    guard try Self.identity(at: temporary) == expected else {
                        throw StoreError("\"\(source)\" was replaced while it was being copied")
                    }
                } else {
                    try Self.copyFile(from, to: temporary, expected: expected, mode: self.modes.file)
                }
            } catch {
                unlink(temporary)
                throw error
            }
            guard rename(temporary, path) == 0 else {
                let message = FileSystem.reason()
                unlink(temporary)
                throw StoreError("cannot place a copy of \"\(source)\" at \(path): \(message)")
            }
            return try Self.afterRename(directory: directory, path: path)
        }
    }

    static func copyFile(_ from: String, to: String, expected: ObjectIdentity, mode: mode_t) throws {
        let input = open(from, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw StoreError("cannot open \(from): \(FileSystem.reason())") }
        defer { Glibc.close(input) }
        var info = stat()
        guard fstat(input, &info) == 0, UInt64(info.st_ino) == expected.inode, UInt64(info.st_dev) == expected.device,
            Int64(info.st_size) == expected.size
        else {
            throw StoreError("\(from) was replaced while it was being copied")
        }
        let output = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard output >= 0 else { throw StoreError("cannot create \(to): \(FileSystem.reason())", isNoSpace: errno == ENOSPC) }
        defer { Glibc.close(output) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(input, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else { throw StoreError("cannot read \(from): \(FileSystem.reason())") }
            if n == 0 { break }
            var done = 0
            while done < n {
                let w = buffer.withUnsafeBytes { write(output, $0.baseAddress! + done, n - done) }
                if w < 0 && errno == EINTR { continue }
                guard w > 0 else { throw StoreError("cannot write \(to): \(FileSystem.reason())", isNoSpace: errno == ENOSPC) }
                done += w
            }
        }
        guard fsync(output) == 0 else { throw StoreError("cannot fsync \(to): \(FileSystem.reason())") }
    }

    public func stagingFiles() async throws -> [(name: String, modified: Date)] {
        try await self.blocking {
            var files: [(name: String, modified: Date)] = []
            let directory = self.stagingDirectory
            guard
                Self.forEachEntry(
                    of: directory,
                    { name in
                        var info = stat()
                        guard lstat(directory + "/" + name, &info) == 0 else { return }
                        files.append((name, Date(timeIntervalSince1970: Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9)))
                    })
            else {
                throw StoreError("cannot list \(self.stagingDirectory): \(FileSystem.reason())")
            }
            return files
        }
    }

    /// Calls `body` with each entry's name but "." and ".." until it returns false; false when the folder cannot be read.
    static func forEachEntry(of directory: String, _ body: (String) -> Bool) -> Bool {
        guard let dir = opendir(directory) else { return false }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                raw.bindMemory(to: CChar.self).baseAddress.map { String(cString: $0) } ?? ""
            }
            if name != "." && name != ".." && !name.isEmpty && !body(name) { break }
        }
        return true
    }

    static func forEachEntry(of directory: String, _ body: (String) -> Void) -> Bool {
        self.forEachEntry(of: directory) { (name: String) -> Bool in
            body(name)
            return true
        }
    }
}

extension LocalDirectoryStore {
    /// Runs `body` on the store's thread pool.
    func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await self.threadPool.runBlocking(body)
    }
}
