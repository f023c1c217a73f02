import Foundation
import NIOCore
import Testing
import UploadAgent
import UploadProtocol
import UploadRelay

/// The local store and the relay's housekeeping, against a real file system.
@Suite("Local store")
struct StoreTests {
    @Test("commit makes the object appear whole under its key; staging is gone")
    func commit() throws {
        let root = TestRelay.makeDirectory()
        let store = try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging")
        let staging = try store.openStaging("s1", truncatingTo: 0)
        try staging.write(ByteBuffer(string: "hello "), at: 0)
        try staging.write(ByteBuffer(string: "world"), at: 6)
        let key = try ObjectKey(validating: "a/b/c.txt")
        #expect(!FileManager.default.fileExists(atPath: root + "/store/a/b/c.txt"))
        try store.commit(staging, as: key)
        #expect(FileManager.default.contents(atPath: root + "/store/a/b/c.txt") == Data("hello world".utf8))
        #expect(try store.stagingNames().isEmpty)
        #expect(try store.size(of: key) == 11)
    }

    @Test("a resume needs its staging file with at least the durable bytes; a missing one is never recreated as zeros")
    func resumeNeedsStaging() throws {
        let root = TestRelay.makeDirectory()
        let store = try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging")
        #expect(throws: StoreError.self) { try store.openStaging("gone", truncatingTo: 4096) }
        #expect(!FileManager.default.fileExists(atPath: root + "/staging/gone"))
        let staging = try store.openStaging("short", truncatingTo: 0)
        try staging.write(ByteBuffer(string: "abc"), at: 0)
        staging.close()
        #expect(throws: StoreError.self) { try store.openStaging("short", truncatingTo: 10) }
        let resumed = try store.openStaging("short", truncatingTo: 2)
        resumed.close()
        #expect(FileManager.default.contents(atPath: root + "/staging/short") == Data("ab".utf8))
    }

    @Test("a symbolic link inside the store cannot lead a key outside it")
    func symlinkEscape() throws {
        let root = TestRelay.makeDirectory()
        let outside = TestRelay.makeDirectory()
        let store = try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging")
        try FileManager.default.createSymbolicLink(atPath: root + "/store/evil", withDestinationPath: outside)
        let staging = try store.openStaging("s", truncatingTo: 0)
        try staging.write(ByteBuffer(string: "x"), at: 0)
        #expect(throws: StoreError.self) { try store.commit(staging, as: try ObjectKey(validating: "evil/file")) }
        #expect(!FileManager.default.fileExists(atPath: outside + "/file"))
    }

    @Test("a connection that never says HELLO is closed after the handshake timeout")
    func handshakeTimeout() async throws {
        let relay = try await TestRelay { $0.limits.handshakeTimeout = .milliseconds(300) }.start()
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #expect(fd >= 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(relay.port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        #expect(connected == 0)
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        // Silent client: the relay must hang up on its own (read returns 0 or a reset, not a timeout).
        var byte: UInt8 = 0
        let started = Date()
        var n = 0
        repeat { n = read(fd, &byte, 1) } while n > 0
        #expect(n == 0 || errno == ECONNRESET, "read ended with errno \(errno)")
        #expect(Date().timeIntervalSince(started) < 9)
        close(fd)
        await relay.stop()
    }
}
