import CUploadDeflate

/// Per-chunk compression: zlib streams (RFC 1950), made and read by libdeflate, a whole buffer at a time (SPEC §9).
/// Any zlib inflater reads what this makes; libdeflate checks each stream's Adler-32 when it inflates.
public enum Deflate {
    /// Why a deflated chunk could not be inflated.
    public struct InflateError: Error, Hashable, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// The most bytes `compress(_:into:level:)` can write for `count` input bytes.
    public static func bound(_ count: Int) -> Int {
        libdeflate_zlib_compress_bound(nil, count)
    }

    /// Compresses `input` into `output`; returns the compressed length, or nil when compression
    /// does not make the chunk smaller (SPEC §9: such a chunk goes raw).
    public static func compress(
        _ input: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, level: Int32 = 1
    ) -> Int? {
        guard let source = input.baseAddress, let destination = output.baseAddress, input.count > 0,
            let compressor = libdeflate_alloc_compressor(level)
        else { return nil }
        defer { libdeflate_free_compressor(compressor) }
        // At most input.count - 1 bytes: libdeflate returns 0 when the stream does not fit, so "no smaller" is 0 too.
        let length = libdeflate_zlib_compress(compressor, source, input.count, destination, min(output.count, input.count - 1))
        return length > 0 ? length : nil
    }

    /// Inflates `input`, which must be one whole zlib stream of exactly `output.count` bytes.
    public static func inflate(_ input: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer) throws {
        guard let source = input.baseAddress, let destination = output.baseAddress else {
            throw InflateError(description: "empty deflated data")
        }
        guard let decompressor = libdeflate_alloc_decompressor() else {
            throw InflateError(description: "no memory for a decompressor")
        }
        defer { libdeflate_free_decompressor(decompressor) }
        var consumed = 0
        var produced = 0
        let status = libdeflate_zlib_decompress_ex(
            decompressor, source, input.count, destination, output.count, &consumed, &produced
        )
        switch status {
        case LIBDEFLATE_SUCCESS:
            guard produced == output.count else {
                throw InflateError(description: "deflated data inflates to \(produced) bytes, not the \(output.count) announced")
            }
            guard consumed == input.count else {
                throw InflateError(description: "\(input.count - consumed) bytes follow the end of the deflated data")
            }
        case LIBDEFLATE_INSUFFICIENT_SPACE:
            throw InflateError(description: "deflated data inflates to more than the \(output.count) bytes announced")
        case LIBDEFLATE_BAD_DATA:
            throw InflateError(description: "deflated data is corrupt or truncated")
        default:
            throw InflateError(description: "libdeflate failed with status \(status.rawValue)")
        }
    }
}
