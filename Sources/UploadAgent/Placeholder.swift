// Filled by the end-to-end work (issue 3).
