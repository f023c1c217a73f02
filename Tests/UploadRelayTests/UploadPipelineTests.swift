import NIOCore
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay

/// The storage decisions of one upload, with no file, no catalog, no thread pool: inputs in, actions out.
@Suite("Upload pipeline: storage decisions without I/O")
struct UploadPipelineTests {
    static let id = StreamID(rawValue: 1)

    static func pipeline(
        byteLimit: Int64? = nil, maxBlobSize: Int64 = 1 << 40, syncBytes: Int64 = 1 << 20, batchBytes: Int = 64 << 10,
        durable: Int64 = 0
    ) -> UploadPipeline {
        UploadPipeline(
            settings: UploadPipeline.Settings(
                streamID: Self.id, key: "k", account: "a", byteLimit: byteLimit, maxBlobSize: maxBlobSize,
                syncBytes: syncBytes, batchBytes: batchBytes
            ),
            durableOffset: durable
        )
    }

    static func chunk(at offset: UInt64, _ count: Int) -> Frame.Chunk {
        Frame.Chunk(streamID: Self.id, offset: offset, crc32: 0, data: ByteBuffer(bytes: [UInt8](repeating: 1, count: count)))
    }

    static func writes(_ actions: [UploadPipeline.Action]) -> [([Frame.Chunk], Int64)] {
        actions.compactMap { if case .storage(.write(let chunks, let offset)) = $0 { return (chunks, offset) } else { return nil } }
    }

    @Test("chunks are written one batch at a time; a small remainder waits for the sync timer, then is acknowledged")
    func writeBatchesThenTimedSync() async {
        var p = Self.pipeline(batchBytes: 100)
        let first = p.enqueue(Self.chunk(at: 0, 60))
        #expect(Self.writes(first).map { $0.1 } == [0])
        // Busy: the next chunks queue, and go together in the next batch (at most 100 bytes).
        #expect(p.enqueue(Self.chunk(at: 60, 30)).isEmpty)
        #expect(p.enqueue(Self.chunk(at: 90, 30)).isEmpty)
        #expect(p.enqueue(Self.chunk(at: 120, 80)).isEmpty)
        let second = p.writeFinished(consumed: [60], error: nil)
        #expect(second.first == .report(.consumed(60)))
        #expect(second.contains(.armSyncTimer))
        #expect(Self.writes(second).map { $0.0.count } == [2])
        #expect(Self.writes(second).map { $0.1 } == [60])
        let third = p.writeFinished(consumed: [30, 30], error: nil)
        #expect(third.filter { if case .report(.consumed) = $0 { return true } else { return false } }.count == 2)
        #expect(!third.contains(.armSyncTimer), "the timer is already armed")
        #expect(Self.writes(third).map { $0.1 } == [120])
        #expect(p.writeFinished(consumed: [80], error: nil) == [.report(.consumed(80))])
        #expect(!p.isQuiet)
        #expect(p.syncTimerFired() == [.storage(.sync(through: 200))])
        #expect(p.syncFinished(.success(200)) == [.report(.durable(200))])
        #expect(p.isQuiet)
    }

    @Test("past the sync threshold, durability comes before more writes (issue 6 finding 23)")
    func syncBeforeMoreWrites() async {
        var p = Self.pipeline(syncBytes: 100, batchBytes: 100)
        _ = p.enqueue(Self.chunk(at: 0, 100))
        _ = p.enqueue(Self.chunk(at: 100, 50))
        let after = p.writeFinished(consumed: [100], error: nil)
        #expect(after == [.report(.consumed(100)), .storage(.sync(through: 100))])
        let synced = p.syncFinished(.success(100))
        #expect(synced.first == .report(.durable(100)))
        #expect(Self.writes(synced).map { $0.1 } == [100])
    }

    @Test("HASH: the rest is written, then committed with no sync of its own; RESULT follows the key's closing and release")
    func hashCommitsWithoutSync() async {
        var p = Self.pipeline()
        _ = p.enqueue(Self.chunk(at: 0, 10))
        let hash = Frame.Hash(streamID: Self.id, size: 10, sha1: SHA1Digest.empty)
        #expect(p.finish(hash).isEmpty, "a write is under way")
        #expect(p.isVerifying)
        let afterWrite = p.writeFinished(consumed: [10], error: nil)
        #expect(afterWrite == [.report(.consumed(10)), .storage(.commit(hash, written: 10))])
        let done = p.commitFinished(.success(.stored))
        let result = Frame.Result(streamID: Self.id, status: .stored, size: 10, sha1: SHA1Digest.empty, key: "k")
        #expect(done.first == .markClosing)
        #expect(done.suffix(2) == [.releaseCommitted, .report(.committed(result))])
        #expect(!done.contains(.storage(.release(discardSession: true))) && !done.contains(.storage(.release(discardSession: false))))
        // Nothing more happens on a released upload.
        #expect(p.enqueue(Self.chunk(at: 10, 1)).isEmpty)
        #expect(p.abort(keepSession: true).isEmpty)
    }

    @Test("an upload of unknown size that passes the quota, or the relay's largest blob, fails and drops its session")
    func byteLimit() async {
        for (limit, code) in [(Int64(50), WireErrorCode.quotaExceeded), (60, .tooLarge)] {
            var p = Self.pipeline(byteLimit: limit, maxBlobSize: 60)
            // The first chunk is being written when the second passes the limit: in-flight bytes count.
            _ = p.enqueue(Self.chunk(at: 0, 40))
            let over = p.enqueue(Self.chunk(at: 40, 21))
            #expect(over.first == .markClosing)
            #expect(over.contains { if case .report(.failed(code, _)) = $0 { return true } else { return false } })
            // The write under way finishes, then the session goes: no consumed events after the end.
            #expect(p.writeFinished(consumed: [40], error: nil) == [.storage(.release(discardSession: true))])
        }
    }

    @Test("a link cut during a write keeps what arrived: written and synced, then released without reporting")
    func abortKeepsReceivedBytes() async {
        var p = Self.pipeline()
        _ = p.enqueue(Self.chunk(at: 0, 10))
        _ = p.enqueue(Self.chunk(at: 10, 10))
        #expect(p.abort(keepSession: true) == [.markClosing])
        let afterFirst = p.writeFinished(consumed: [10], error: nil)
        #expect(Self.writes(afterFirst).map { $0.1 } == [10], "the queued chunk is still written")
        #expect(p.writeFinished(consumed: [10], error: nil) == [.storage(.sync(through: 20))])
        #expect(p.syncFinished(.success(20)) == [.storage(.release(discardSession: false))])
    }

    @Test("a store that keeps a short tail back (S3 parts): no ACK for it, no second sync until more arrives, quiet, and a cut lets go")
    func storeKeepsTailBack() async {
        var p = Self.pipeline(syncBytes: 100)
        _ = p.enqueue(Self.chunk(at: 0, 100))
        #expect(p.writeFinished(consumed: [100], error: nil) == [.report(.consumed(100)), .storage(.sync(through: 100))])
        #expect(p.syncFinished(.success(100)) == [.report(.durable(100))])
        _ = p.enqueue(Self.chunk(at: 100, 30))
        #expect(p.writeFinished(consumed: [30], error: nil) == [.report(.consumed(30)), .armSyncTimer])
        #expect(p.syncTimerFired() == [.storage(.sync(through: 130))])
        // The store kept the 30 bytes back: nothing is acknowledged, and nothing asks it again with nothing new.
        #expect(p.syncFinished(.success(0)).isEmpty)
        #expect(p.durable == 100)
        #expect(p.isQuiet, "what it could make durable, it did: a graceful close does not wait for the tail")
        #expect(p.requestSync().isEmpty)
        #expect(p.syncTimerFired().isEmpty)
        // More bytes: the next sync takes the tail with them.
        _ = p.enqueue(Self.chunk(at: 130, 80))
        #expect(p.writeFinished(consumed: [80], error: nil) == [.report(.consumed(80)), .storage(.sync(through: 210))])
        #expect(p.syncFinished(.success(210)) == [.report(.durable(210))])
        // A cut with a tail kept back: one sync on the way out, then released (never a loop of syncs).
        _ = p.enqueue(Self.chunk(at: 210, 10))
        _ = p.writeFinished(consumed: [10], error: nil)
        #expect(p.abort(keepSession: true) == [.markClosing, .cancelSyncTimer, .storage(.sync(through: 220))])
        #expect(p.syncFinished(.success(0)) == [.storage(.release(discardSession: false))])
        #expect(p.durable == 210)
    }

    @Test("a bad chunk is never written: the bytes before it are made durable for a resume, the error reported once")
    func badChunkKeepsPrefix() async {
        var p = Self.pipeline()
        _ = p.enqueue(Self.chunk(at: 0, 10))
        let bad = p.writeFinished(consumed: [], error: (.crcMismatch, "chunk at offset 0"))
        #expect(bad.contains(.report(.failed(.crcMismatch, "chunk at offset 0"))))
        #expect(bad.last == .storage(.release(discardSession: false)))
    }

    @Test("a commit refused keeping the session makes the bytes durable on the way out, then lets go")
    func refusedCommitKeepsBytes() async {
        var p = Self.pipeline()
        _ = p.enqueue(Self.chunk(at: 0, 10))
        let hash = Frame.Hash(streamID: Self.id, size: 10, sha1: SHA1Digest.empty)
        _ = p.finish(hash)
        #expect(p.writeFinished(consumed: [10], error: nil).last == .storage(.commit(hash, written: 10)))
        let refused = p.commitFinished(.failure(UploadPolicy.Refusal(code: .storageError, message: "disk", keepSession: true)))
        #expect(refused.contains(.report(.failed(.storageError, "disk"))))
        #expect(refused.last == .storage(.sync(through: 10)))
        #expect(p.syncFinished(.success(10)) == [.storage(.release(discardSession: false))])
    }

    @Test("a commit that crosses CANCEL reports nothing and lets go of the session")
    func cancelCrossesCommit() async {
        var p = Self.pipeline()
        _ = p.finish(Frame.Hash(streamID: Self.id, size: 0, sha1: SHA1Digest.empty))
        #expect(p.abort(keepSession: false) == [.markClosing])
        #expect(p.commitFinished(.success(.stored)) == [.storage(.release(discardSession: true))])
    }

    @Test("a failed sync reports STORAGE_ERROR and lets go without trying again")
    func syncFailure() async {
        var p = Self.pipeline(syncBytes: 10)
        _ = p.enqueue(Self.chunk(at: 0, 10))
        #expect(p.writeFinished(consumed: [10], error: nil).last == .storage(.sync(through: 10)))
        let failed = p.syncFinished(.failure(UploadPipeline.SyncFailure(description: "disk gone")))
        #expect(failed.contains(.report(.failed(.storageError, "disk gone"))))
        #expect(failed.last == .storage(.release(discardSession: false)))
    }

    /// Seeded random inputs in any order the event loop could deliver them; prints the seed.
    @Test("random inputs in any order: one piece of work at a time, nothing reported after the end, one release", arguments: 0..<40)
    func randomOrders(round: Int) async {
        let seed = UInt64(0x5EED_0000) + UInt64(round)
        var rng = SeededGenerator(seed: seed)
        let limit: Int64? = Bool.random(using: &rng) ? Int64.random(in: 1...400, using: &rng) : nil
        var p = Self.pipeline(byteLimit: limit, syncBytes: Int64.random(in: 1...200, using: &rng), batchBytes: Int.random(in: 1...120, using: &rng))
        var work: UploadPipeline.StorageStep? = nil
        var timer = false
        var ended = false
        var released = 0
        var received: Int64 = 0
        var reportedDurable: UInt64 = 0
        var consumed = 0
        var hashSent = false
        func take(_ actions: [UploadPipeline.Action]) {
            for action in actions {
                switch action {
                case .storage(.release):
                    released += 1
                case .storage(let step):
                    #expect(work == nil, "seed \(seed): two pieces of work at once")
                    #expect(released == 0, "seed \(seed): work after release")
                    work = step
                case .armSyncTimer:
                    timer = true
                case .cancelSyncTimer:
                    timer = false
                case .markClosing:
                    #expect(!ended, "seed \(seed): closing twice")
                    ended = true
                case .releaseCommitted:
                    released += 1
                case .report(let event):
                    #expect(
                        released == 0 || { if case .committed = event { return true } else { return false } }(), "seed \(seed): report after release")
                    switch event {
                    case .consumed(let n):
                        #expect(!ended, "seed \(seed): credit after the end")
                        consumed += n
                    case .durable(let offset):
                        #expect(!ended && offset >= reportedDurable, "seed \(seed): ACK after the end or backwards")
                        reportedDurable = offset
                    case .committed, .failed:
                        #expect(ended, "seed \(seed): stream end reported before the key was closing")
                    }
                }
            }
        }
        for _ in 0..<200 where released == 0 {
            switch Int.random(in: 0..<10, using: &rng) {
            case 0...3 where !hashSent:
                let n = Int.random(in: 1...50, using: &rng)
                take(p.enqueue(Self.chunk(at: UInt64(received), n)))
                received += Int64(n)
            case 4 where !hashSent && Int.random(in: 0..<4, using: &rng) == 0:
                hashSent = true
                take(p.finish(Frame.Hash(streamID: Self.id, size: UInt64(received), sha1: SHA1Digest.empty)))
            case 5 where timer:
                timer = false
                take(p.syncTimerFired())
            case 6 where Int.random(in: 0..<15, using: &rng) == 0:
                take(p.abort(keepSession: Bool.random(using: &rng)))
            case 7 where Int.random(in: 0..<5, using: &rng) == 0:
                take(p.requestSync())
            default:
                guard let current = work else { continue }
                work = nil
                let fails = Int.random(in: 0..<20, using: &rng) == 0
                switch current {
                case .write(let chunks, _):
                    let done = fails ? Array(chunks.prefix(Int.random(in: 0..<chunks.count, using: &rng))) : chunks
                    take(p.writeFinished(consumed: done.map(\.payloadLength), error: fails ? (.crcMismatch, "bad") : nil))
                case .sync(let offset):
                    take(p.syncFinished(fails ? .failure(UploadPipeline.SyncFailure(description: "io")) : .success(offset)))
                case .commit:
                    take(
                        p.commitFinished(
                            fails ? .failure(UploadPolicy.Refusal(code: .alreadyExists, message: "x", keepSession: false)) : .success(.stored)))
                default:
                    break
                }
            }
        }
        // The agent goes away; storage finishes whatever is under way.
        take(p.abort(keepSession: true))
        while let current = work, released == 0 {
            work = nil
            switch current {
            case .write(let chunks, _): take(p.writeFinished(consumed: chunks.map(\.payloadLength), error: nil))
            case .sync(let offset): take(p.syncFinished(.success(offset)))
            case .commit: take(p.commitFinished(.success(.stored)))
            default: break
            }
        }
        #expect(released == 1, "seed \(seed): released \(released) times")
        #expect(work == nil, "seed \(seed): work left after release")
        #expect(Int64(consumed) <= received, "seed \(seed): consumed more than received")
        #expect(reportedDurable <= UInt64(p.written), "seed \(seed): acknowledged bytes never written")
    }
}
