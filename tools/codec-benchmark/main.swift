// Codec benchmark (not a test): encode + decode throughput of the frame codec, release build.
//
//   swift run -c release codec-benchmark [--seconds S]
//
// Prints GB/s for 1 MiB CHUNK frames (the codec's share of an upload) and frames/s for small
// control frames (ACK, CREDIT, OPEN), and the codec's cost as a share of a 1 GB/s upload; then the
// checksums every byte pays on each side (SHA-1 from libcrypto, CRC-32 from libdeflate or zlib), in CPU-seconds per
// GB: the floor the integrity checks put under an upload's CPU, whatever the rest of the path does; and what --deflate
// costs per MiB of text-like data. UPLOAD_DEFLATE_LIBRARY=zlib measures zlib where libdeflate is installed.

import Foundation
import NIOCore
import UploadChecksums
import UploadProtocol

let arguments = CommandLine.arguments
let seconds = arguments.firstIndex(of: "--seconds").flatMap { Double(arguments[$0 + 1]) } ?? 2.0

func now() -> Double {
    Double(DispatchTime.now().uptimeNanoseconds) / 1e9
}

/// Runs `body` in batches until `seconds` have passed; returns iterations per second.
@inline(never)
func measure(_ name: String, batch: Int, _ body: () -> Void) -> Double {
    // Warm up.
    for _ in 0..<batch { body() }
    var iterations = 0
    let start = now()
    var elapsed = 0.0
    repeat {
        for _ in 0..<batch { body() }
        iterations += batch
        elapsed = now() - start
    } while elapsed < seconds
    return Double(iterations) / elapsed
}

var sink = 0
let allocator = ByteBufferAllocator()

// 1 MiB chunks: the encoder writes header + fields and hands back the payload uncopied; the
// decoder cuts the frame out of a receive buffer (as a TLS read would hand it over) without copying.
let payloadSize = 1 << 20
let payload = allocator.buffer(repeating: 0xA5, count: payloadSize)
let chunk = Frame.chunk(Frame.Chunk(streamID: 1, offset: 0, crc32: 0x1234_5678, data: payload))
var wire = allocator.buffer(capacity: payloadSize + 64)
var header = allocator.buffer(capacity: 64)
let chunkRate = measure("chunk", batch: 64) {
    header.clear()
    let data = FrameEncoder.encode(chunk, into: &header)!
    // What a socket write of header + data amounts to in a receive buffer.
    wire.clear()
    wire.writeImmutableBuffer(header)
    wire.writeImmutableBuffer(data)
    var decoder = FrameDecoder(maxFrameSize: 1_114_112)
    if case .chunk(let c)? = try! decoder.decodeFrame(from: &wire) {
        sink &+= c.data.readableBytes
    }
}
let gbps = chunkRate * Double(payloadSize) / 1e9

// The same without the copy into a receive buffer: the codec alone.
var prebuilt = chunk.encoded()
let codecOnlyRate = measure("chunk-codec-only", batch: 256) {
    header.clear()
    sink &+= FrameEncoder.encode(chunk, into: &header)!.readableBytes
    var input = prebuilt
    var decoder = FrameDecoder(maxFrameSize: 1_114_112)
    if case .chunk(let c)? = try! decoder.decodeFrame(from: &input) {
        sink &+= c.data.readableBytes
    }
}
let codecOnlyGbps = codecOnlyRate * Double(payloadSize) / 1e9

// Small control frames, 64 to a buffer, as they arrive in bulk.
let controls: [Frame] = [
    .ack(Frame.Ack(streamID: 7, offset: 123_456_789)),
    .credit(Frame.Credit(streamID: .connection, increment: 1 << 20)),
    .open(Frame.Open(streamID: 9, key: "photos/2026/11/IMG_0001.jpg", size: 4_000_000)),
    .hash(Frame.Hash(streamID: 9, size: 4_000_000, sha1: SHA1Digest.empty)),
]
var controlBuffer = allocator.buffer(capacity: 64 * 80)
let batchFrames = 64
let controlRate = measure("control", batch: 200) {
    controlBuffer.clear()
    for i in 0..<batchFrames {
        FrameEncoder.encode(controls[i & 3], into: &controlBuffer)
    }
    var decoder = FrameDecoder(maxFrameSize: 1_114_112)
    while let frame = try! decoder.decodeFrame(from: &controlBuffer) {
        sink &+= Int(frame.streamID.rawValue)
    }
} * Double(batchFrames)

// The codec's share of a 1 GB/s upload: its time per MiB against the 1 ms a MiB takes at 1 GB/s.
// At 1 MiB per chunk the control frames (one ACK and at most two CREDITs per chunk) add theirs.
let codecSecondsPerMiB = 1.0 / codecOnlyRate + 3.0 / controlRate
let share = codecSecondsPerMiB / (Double(payloadSize) / 1e9) * 100
print("codec benchmark (release, \(seconds) s per case)")
print(String(format: "  1 MiB CHUNK encode+decode, codec alone (zero-copy):         %9.1f GB/s", codecOnlyGbps))
print(String(format: "  1 MiB CHUNK encode+decode + copy into a receive buffer:     %9.2f GB/s  (the copy is the transport's)", gbps))
print(String(format: "  control frames (ACK/CREDIT/OPEN/HASH) encode+decode:        %9.2f M frames/s", controlRate / 1e6))
print(String(format: "  codec share of a 1 GB/s upload (chunk + 3 control frames per MiB): %.3f %% (aim: under 5 %%)", share))

// The checksums, over 1 MiB at a time, as the agent and the relay each run them.
let checksummed = [UInt8](repeating: 0x5A, count: payloadSize)
var sha1 = SHA1()
let sha1Rate = checksummed.withUnsafeBytes { bytes in measure("sha1", batch: 16) { sha1.update(bytes) } }
var crc = CRC32()
let crcRate = checksummed.withUnsafeBytes { bytes in measure("crc32", batch: 16) { crc.update(bytes) } }
sink &+= Int(crc.value) &+ Int(sha1.byteCount)
let sha1Gbps = sha1Rate * Double(payloadSize) / 1e9
let crcGbps = crcRate * Double(payloadSize) / 1e9
print(String(format: "  SHA-1 (libcrypto):                                          %9.2f GB/s = %.2f CPU-s/GB", sha1Gbps, 1 / sha1Gbps))
let library = Deflate.library.padding(toLength: 10, withPad: " ", startingAt: 0)
print(String(format: "  CRC-32 (%@):                                     %9.2f GB/s = %.2f CPU-s/GB", library, crcGbps, 1 / crcGbps))
print(String(format: "  both, on both sides of an upload:                           %.2f CPU-s/GB", 2 * (1 / sha1Gbps + 1 / crcGbps)))

// --deflate: a chunk of text-like bytes (log lines with counters) compressed at level 1 and inflated, 1 MiB at a time.
let text = Array((0..<payloadSize / 48 + 1).map { "line \($0): upload committed, offset \($0 &* 7919)\n" }.joined().utf8.prefix(payloadSize))
var packed = [UInt8](repeating: 0, count: Deflate.bound(text.count))
var packedLength = 0
let compressRate = text.withUnsafeBytes { input in
    packed.withUnsafeMutableBytes { output in
        measure("deflate", batch: 4) { packedLength = Deflate.compress(input, into: output) ?? 0 }
    }
}
var inflated = [UInt8](repeating: 0, count: text.count)
let inflateRate = packed.withUnsafeBytes { input in
    inflated.withUnsafeMutableBytes { output in
        measure("inflate", batch: 4) { try? Deflate.inflate(UnsafeRawBufferPointer(rebasing: input.prefix(packedLength)), into: output) }
    }
}
sink &+= Int(inflated[inflated.count / 2])
print(
    String(
        format: "  deflate level 1 (%@), text-like, to %.0f %%:       %9.2f GB/s; inflate %.2f GB/s", library,
        100 * Double(packedLength) / Double(text.count), compressRate * Double(text.count) / 1e9, inflateRate * Double(text.count) / 1e9))
if sink == 42 { print("") }
