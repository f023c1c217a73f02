import CUploadDeflate

/// Per-chunk compression: zlib streams (RFC 1950), made and read a whole buffer at a time (SPEC §9) by libdeflate when
/// it is installed, else by zlib. Any zlib inflater reads what this makes; the inflater checks each stream's Adler-32.
public enum Deflate {
    /// Why a deflated chunk could not be inflated.
    public struct InflateError: Error, Hashable, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// The library that computes CRC-32s and zlib streams: "libdeflate" or "zlib".
    public static var library: String { String(cString: upload_deflate_library()) }

    /// The most bytes `compress(_:into:level:)` can write for `count` input bytes.
    public static func bound(_ count: Int) -> Int {
        upload_zlib_compress_bound(count)
    }

    /// Compresses `input` into `output`; returns the compressed length, or nil when compression
    /// does not make the chunk smaller (SPEC §9: such a chunk goes raw).
    public static func compress(
        _ input: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, level: Int32 = 1
    ) -> Int? {
        guard let source = input.baseAddress, let destination = output.baseAddress, input.count > 0 else { return nil }
        // At most input.count - 1 bytes: a stream that does not fit is 0, so "no smaller" is 0 too.
        let length = upload_zlib_compress(level, source, input.count, destination, min(output.count, input.count - 1))
        return length > 0 ? length : nil
    }

    /// Inflates `input`, which must be one whole zlib stream of exactly `output.count` bytes.
    public static func inflate(_ input: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer) throws {
        guard let source = input.baseAddress, let destination = output.baseAddress else {
            throw InflateError(description: "empty deflated data")
        }
        var consumed = 0
        var produced = 0
        let status = upload_zlib_inflate(source, input.count, destination, output.count, &consumed, &produced)
        switch status {
        case UPLOAD_INFLATE_SUCCESS:
            guard produced == output.count else {
                throw InflateError(description: "deflated data inflates to \(produced) bytes, not the \(output.count) announced")
            }
            guard consumed == input.count else {
                throw InflateError(description: "\(input.count - consumed) bytes follow the end of the deflated data")
            }
        case UPLOAD_INFLATE_INSUFFICIENT_SPACE:
            throw InflateError(description: "deflated data inflates to more than the \(output.count) bytes announced")
        case UPLOAD_INFLATE_NO_MEMORY:
            throw InflateError(description: "no memory for a decompressor")
        default:
            throw InflateError(description: "deflated data is corrupt or truncated")
        }
    }
}
