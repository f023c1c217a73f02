#if canImport(Glibc)
import UploadRelay
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import UploadChecksums
import UploadProtocol

/// What the store holds: an object's identity and content SHA-1, key conflicts, staging files.
extension LocalDirectoryStore {
    public func identity(of key: ObjectKey, account: String) async throws -> ObjectIdentity? {
        try await self.blocking {
            try Self.identity(at: self.path(of: key, account: account))
        }
    }

    static func identity(at path: String) throws -> ObjectIdentity? {
        var info = stat()
        guard lstat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return nil }
        return ObjectIdentity(
            device: UInt64(info.st_dev), inode: UInt64(info.st_ino), size: Int64(info.st_size),
            modified: Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec)
        )
    }

    public func contentSHA1(of key: ObjectKey, account: String) async throws -> SHA1Digest? {
        try await self.blocking {
            let path = try self.path(of: key, account: account)
            guard try Self.identity(at: path) != nil else { return nil }
            let fd = open(path, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { throw StoreError("cannot open \(path): \(FileSystem.reason())") }
            defer { Glibc.close(fd) }
            var sha1 = SHA1()
            var buffer = [UInt8](repeating: 0, count: 1 << 20)
            while true {
                let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                guard n >= 0 else { throw StoreError("cannot read \(path): \(FileSystem.reason())") }
                if n == 0 { break }
                buffer.withUnsafeBytes { sha1.update(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            }
            return SHA1Digest(bytes: sha1.finalize())
        }
    }

    public func conflict(for key: ObjectKey, account: String) async throws -> String? {
        try await self.blocking { try self.conflictNow(for: key, account: account) }
    }

    /// ``conflict(for:account:)``, on the caller's thread.
    func conflictNow(for key: ObjectKey, account: String) throws -> String? {
        let base = try self.accountDirectory(account)
        let segments = key.segments
        var path = base
        var info = stat()
        for (index, segment) in segments.enumerated() {
            path += "/" + segment
            guard lstat(path, &info) == 0 else { return nil }
            let isDirectory = (info.st_mode & S_IFMT) == S_IFDIR
            let prefix = segments[0...index].joined(separator: "/")
            if index < segments.count - 1 && !isDirectory {
                return KeyConflict.underObject(prefix, key: key)
            }
            if index == segments.count - 1 && isDirectory {
                return KeyConflict.folder(key, example: Self.someKey(under: path, named: key.value))
            }
        }
        return nil
    }

    /// One key stored below the folder `path` (named `prefix` as a key), for messages.
    static func someKey(under path: String, named prefix: String) -> String {
        var directory = path
        var name = prefix
        for _ in 0..<32 {
            var child: String? = nil
            _ = Self.forEachEntry(of: directory) { entry in
                child = entry
                return false
            }
            guard let child else { break }
            directory += "/" + child
            name += "/" + child
            var info = stat()
            guard lstat(directory, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else { return name }
        }
        return name + "/…"
    }

    public func hasStaging(_ name: String) async throws -> Bool {
        try await self.blocking {
            access(self.stagingDirectory + "/" + name, F_OK) == 0
        }
    }
}
