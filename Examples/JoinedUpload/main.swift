// An example of the agent's Swift API: a BlobSource of your own, uploaded with UploadClient.
//
// Cameras split long recordings into pieces (FAT32 caps a file at 4 GiB: CLIP0001.MP4, CLIP0002.MP4, ...). This
// uploads the pieces as ONE object, joined on the fly: no temporary copy, resumable, with dedup and progress.
//
//     UPLOAD_RELAY=relay.example:7443 UPLOAD_TOKEN=... UPLOAD_CA=ca.pem \
//         upload-joined clips/2026-11-24.mp4 CLIP0001.MP4 CLIP0002.MP4 CLIP0003.MP4
//
// Exit status 0 when the relay stored it, 1 when it did not, 2 for a usage error.
import Foundation
import NIOCore
import Synchronization
import UploadAgent

/// Several files read as one blob. A piece that fails to read (the card was remounted, the network file system went
/// stale) makes the source invalid: the agent calls `reopen()`, checks the fingerprint and reads on.
final class JoinedSource: BlobSource {
    let paths: [String]
    /// The open pieces, each with where it starts in the blob: sources are called from the agent's I/O threads.
    private let pieces = Mutex<[(source: FileSource, start: UInt64, size: UInt64)]>([])

    init(paths: [String]) {
        self.paths = paths
    }

    var displayName: String { self.paths.joined(separator: " + ") }
    var isSeekable: Bool { true }

    func open() throws -> SourceInfo {
        try self.pieces.withLock { pieces in
            pieces.forEach { $0.source.close() }
            pieces = []
            var start: UInt64 = 0
            var fingerprints: [UInt8] = []
            for path in self.paths {
                let source = FileSource(path: path)
                let info = try source.open()
                guard let size = info.size else { throw SourceError("\(path) has no size") }
                pieces.append((source, start, size))
                fingerprints += info.fingerprint
                start += size
            }
            // The pieces' fingerprints together: any piece changed, the blob changed.
            return SourceInfo(size: start, fingerprint: fingerprints)
        }
    }

    func read(at offset: UInt64, maxLength: Int, allocator: ByteBufferAllocator) throws -> ByteBuffer {
        let piece = self.pieces.withLock { $0.last { $0.start <= offset && offset < $0.start + $0.size } }
        guard let piece else { return allocator.buffer(capacity: 0) }  // the end
        do {
            // One piece per read: a read may return fewer bytes than asked, and the agent asks again.
            return try piece.source.read(at: offset - piece.start, maxLength: maxLength, allocator: allocator)
        } catch {
            throw SourceInvalidated("\(piece.source.path): \(error)")
        }
    }

    func reopen() throws -> SourceInfo {
        try self.open()
    }

    func changeSinceOpen() -> String? {
        let pieces = self.pieces.withLock { $0 }
        return pieces.lazy.compactMap { $0.source.changeSinceOpen() }.first
    }

    func close() {
        self.pieces.withLock { pieces in
            pieces.forEach { $0.source.close() }
            pieces = []
        }
    }
}

func fail(_ message: String, status: Int32) -> Never {
    FileHandle.standardError.write(Data("upload-joined: \(message)\n".utf8))
    exit(status)
}

let arguments = Array(CommandLine.arguments.dropFirst())
let environment = ProcessInfo.processInfo.environment
guard arguments.count >= 2 else {
    fail("usage: upload-joined KEY PIECE... (with UPLOAD_RELAY=HOST:PORT, UPLOAD_TOKEN and, for a private CA, UPLOAD_CA)", status: 2)
}
guard let relay = environment["UPLOAD_RELAY"], let colon = relay.lastIndex(of: ":"), let port = Int(relay[relay.index(after: colon)...]),
    let token = environment["UPLOAD_TOKEN"]
else {
    fail("set UPLOAD_RELAY=HOST:PORT and UPLOAD_TOKEN", status: 2)
}

let configuration = AgentConfiguration(relayHost: String(relay[..<colon]), relayPort: port, token: token, caPath: environment["UPLOAD_CA"])
let client = UploadClient(configuration: configuration)
let upload = client.upload(JoinedSource(paths: Array(arguments.dropFirst())), key: arguments[0])
var lastPercent = -1
for await progress in upload.progress {
    // Durable bytes: what a crash of either side would not lose.
    guard let fraction = progress.fractionAcknowledged, Int(fraction * 100) != lastPercent else { continue }
    lastPercent = Int(fraction * 100)
    FileHandle.standardError.write(Data("\r\(arguments[0]): \(lastPercent)% on the relay".utf8))
}
FileHandle.standardError.write(Data("\n".utf8))
let outcome = await upload.outcome
try? await client.shutdown()
guard outcome.status != .failed else { fail(outcome.error ?? "failed", status: 1) }
print("\(outcome.status.rawValue) \(outcome.key) \(outcome.bytes) bytes sha1 \(outcome.sha1), \(outcome.sentBytes) bytes sent")
